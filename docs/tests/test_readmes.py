"""Every package README's example is a file that CI runs, character for character.

A README marks its example with ``<!-- example: PATH -->`` (PATH from the repository root) on the
line before the ```` ```python ```` block; the block must be that file without its module
docstring. The files under docs/examples/ run in test_examples.py; packages/kvps/example.py is run
by kvps's tests. So an example edited in a README alone, or a file changed without its README,
fails here, and an example that stops working fails there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: packages whose README examples must all be marked (every ```python block of "## Example")
STRICT = ["shardlayers", "mpiad", "distx-fake"]

_MARKED = re.compile(r"<!-- example: (\S+) -->\n```python\n(.*?)\n```\n", re.S)


def marked_examples(readme: str) -> list[tuple[str, str]]:
    """The (path, code) pairs of a README's marked python blocks, in order."""
    return _MARKED.findall(readme)


def without_docstring(source: str) -> str:
    """The text of a Python file after its module docstring (what the docs pages include).

    Raises
    ------
    ValueError
        If the file has no module docstring (an example says what it shows and how to run it).
    """
    body = ast.parse(source).body
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
        raise ValueError("an example file starts with a module docstring")
    end = body[0].end_lineno
    assert end is not None
    return "\n".join(source.splitlines()[end:]).strip("\n")


def section(readme: str, heading: str) -> str:
    """The text of a README's level-2 section (up to the next level-2 heading), '' if absent."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    return m.group(1) if m else ""


def test_helpers_find_marked_blocks_and_strip_docstrings() -> None:
    readme = "# p\n\n## Example\n\n<!-- example: a.py -->\n```python\nx = 1\n```\n\n```python\ny\n```\n\n## Next\n"
    assert marked_examples(readme) == [("a.py", "x = 1")]
    assert section(readme, "Example").count("```python") == 2
    assert section(readme, "Missing") == ""
    assert without_docstring('"""Doc.\n\nMore.\n"""\n\nimport os\n\nprint(os.sep)\n') == "import os\n\nprint(os.sep)"
    with pytest.raises(ValueError, match="module docstring"):
        without_docstring("import os\n")


@pytest.mark.parametrize("package", sorted(p.parent.name for p in (ROOT / "packages").glob("*/README.md")))
def test_readme_examples_are_the_files_that_run(package: str) -> None:
    readme = (ROOT / "packages" / package / "README.md").read_text()
    for path, code in marked_examples(readme):
        source = (ROOT / path).read_text()
        assert code == without_docstring(source), f"packages/{package}/README.md's example differs from {path}"
    if package in STRICT:
        example = section(readme, "Example")
        n_blocks = example.count("```python")
        assert n_blocks >= 1, f"packages/{package}/README.md has no python example"
        n_marked = len(marked_examples(example))
        assert n_marked == n_blocks, f"packages/{package}/README.md: {n_blocks - n_marked} example(s) not run by CI"


def test_strict_readme_examples_are_run_by_the_docs_tests() -> None:
    """The files the three READMEs show are the ones test_examples.py runs."""
    run = (DOCS / "tests" / "test_examples.py").read_text()
    for package in STRICT:
        for path, _ in marked_examples((ROOT / "packages" / package / "README.md").read_text()):
            assert path.startswith("docs/examples/"), path
            assert f'"{Path(path).name}"' in run, f"{path} is not run by docs/tests/test_examples.py"
