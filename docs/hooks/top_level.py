"""MkDocs hook: put a top-level file (METRICS.md, MIGRATION.md, CHANGELOG.md) on the site.

A page whose only content line is ``--8<-- "<FILE>.md"`` naming one of ``PAGES`` gets
that file whole, with each relative link rewritten to work from ``docs/``:
``docs/x.md`` becomes ``x.md`` and a top-level file with a page of its own becomes that
page. A link to any other file outside ``docs/`` fails the build (it would be broken on
the site). So the top-level files stay the source, readable on GitHub, and the site
never holds a copy that can drift.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PAGES = {"METRICS.md": "metrics.md", "MIGRATION.md": "migration.md", "CHANGELOG.md": "changelog.md"}
_INCLUDE = re.compile(r'^--8<-- "(?P<file>[A-Z]+\.md)"\s*$', re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


class TopLevelLinkError(Exception):
    pass


def for_the_site(text: str, name: str) -> str:
    """``text`` of top-level file ``name`` with its relative links made relative to docs/."""

    def target(m: re.Match[str]) -> str:
        url = m[1]
        path, _, anchor = url.partition("#")
        if re.match(r"[a-z]+:", url) or not path:  # external, or an anchor on the page
            return m[0]
        if path.startswith("docs/"):
            new = path.removeprefix("docs/")
        elif path in PAGES:
            new = PAGES[path]
        else:
            raise TopLevelLinkError(f"{name} links to {path}, which is not on the site")
        return f"]({new}{'#' + anchor if anchor else ''})"

    return _LINK.sub(target, text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    root = Path(config["config_file_path"]).parent

    def include(m: re.Match[str]) -> str:
        name = m["file"]
        if name not in PAGES:
            return m[0]
        return for_the_site((root / name).read_text(encoding="utf-8"), name)

    return _INCLUDE.sub(include, markdown)
