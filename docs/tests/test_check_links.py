"""docs/check_links.py finds every broken internal link and anchor, and only those."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("check_links", Path(__file__).resolve().parents[1] / "check_links.py")
assert _spec is not None and _spec.loader is not None
check_links = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_links)


def _site(root: Path) -> None:
    (root / "guide").mkdir(parents=True)
    (root / "_static").mkdir()
    (root / "_static" / "x.css").write_text("")
    (root / "index.html").write_text(
        '<link href="_static/x.css"><a href="guide/page.html#semantics">ok</a>'
        '<a href="guide/page.html#nowhere">bad anchor</a><a href="missing.html">bad file</a>'
        '<a href="https://example.org/x.html">external</a><a href="#top">self</a><h1 id="top">t</h1>'
        '<img src="_images/plot.png">'
    )
    (root / "guide" / "page.html").write_text(
        '<h2 id="semantics">s</h2><a href="../index.html#top">up</a><a name="old">'
    )


def test_reports_each_broken_link_and_nothing_else(tmp_path: Path) -> None:
    _site(tmp_path)
    problems = check_links.broken_links(tmp_path)
    assert len(problems) == 3, problems
    assert problems[0].startswith("index.html: guide/page.html#nowhere (no anchor #nowhere")
    assert problems[1].startswith("index.html: missing.html (no file")
    assert problems[2].startswith("index.html: _images/plot.png (no file")
    assert check_links.main([str(tmp_path)]) == 1


def test_a_clean_site_passes(tmp_path: Path) -> None:
    _site(tmp_path)
    (tmp_path / "index.html").write_text(
        '<h1 id="top">t</h1><a href="guide/page.html#semantics">ok</a><a href="guide/page.html#old">named</a>'
    )
    assert check_links.broken_links(tmp_path) == []
    assert check_links.main([str(tmp_path)]) == 0


def test_refuses_a_folder_that_is_not_a_site(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="holds no index.html"):
        check_links.broken_links(tmp_path)
    assert check_links.main([]) == 2
