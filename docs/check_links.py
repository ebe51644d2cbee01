"""Check every internal link of a built HTML site: each relative href/src names a file that exists
and, when it has a #fragment, an id (or name) in that file.

    python docs/check_links.py build/docs/html

External links (with a scheme, e.g. https:, mailto:) are not followed: the build machines are offline.
Exit status 1 with one line per broken link, 0 when every internal link resolves.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    """The ids a page defines and the internal links it makes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if value is None:
                continue
            if key == "id" or (key == "name" and tag == "a"):
                self.ids.add(value)
            elif (key == "href" and tag in {"a", "link"}) or (key == "src" and tag in {"img", "script"}):
                self.links.append(value)


def _parse(path: Path, cache: dict[Path, _Page]) -> _Page:
    if path not in cache:
        page = _Page()
        page.feed(path.read_text(encoding="utf-8", errors="replace"))
        cache[path] = page
    return cache[path]


def broken_links(root: Path) -> list[str]:
    """Every internal link under `root` that names a missing file or anchor, as 'page: link (why)'.

    Parameters
    ----------
    root : Path
        The folder of the built site (the one holding index.html).

    Returns
    -------
    list of str
        One line per broken link; empty when every link resolves.

    Raises
    ------
    FileNotFoundError
        If `root` holds no index.html.
    """
    if not (root / "index.html").is_file():
        raise FileNotFoundError(f"{root} holds no index.html: is it a built HTML site?")
    cache: dict[Path, _Page] = {}
    problems: list[str] = []
    pages = sorted(p for p in root.rglob("*.html") if "_static" not in p.parts)
    for page_path in pages:
        for link in _parse(page_path, cache).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:
                continue  # external: not checked offline
            rel = page_path.relative_to(root)
            if not parts.path:
                target = page_path
            else:
                target = (page_path.parent / unquote(parts.path)).resolve()
                if target.is_dir():
                    target = target / "index.html"
            if not target.is_file():
                problems.append(f"{rel}: {link} (no file {target})")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html" and fragment not in _parse(target, cache).ids:
                problems.append(f"{rel}: {link} (no anchor #{parts.fragment} in {target.relative_to(root)})")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_links.py BUILT_HTML_DIR", file=sys.stderr)
        return 2
    root = Path(argv[0]).resolve()
    problems = broken_links(root)
    for line in problems:
        print(line)
    n = len(list(root.rglob("*.html")))
    print(f"check_links: {n} pages, {len(problems)} broken internal links")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
