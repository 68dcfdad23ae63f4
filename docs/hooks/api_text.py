"""MkDocs hook: what the API reference renders from docstrings, made readable.

The docstrings use Sphinx roles (``:meth:`handle```, ``:class:`Retry```), which
mkdocstrings leaves as literal text (``:meth:handle``), and signatures whose defaults
are named constants (``key_prefix: str = DEFAULT_PREFIX``). Once a page is written out
(cross-references resolved):

* a role becomes a link to the object it names on the same page when exactly one
  anchor there ends with that name (``streamjobs.StreamConsumer.handle`` for
  ``handle``), else plain code; the role itself never shows;
* a default that names an UPPER_CASE constant of the package shows its value
  (``'streamjobs'``).

tests/tools/test_docs_site.py fails on a literal role anywhere in the built site.
"""

from __future__ import annotations

import html
import importlib
import re
from typing import Any

ROLE = re.compile(r":(?:meth|class|attr|func|data|exc|mod|obj|const):<code>~?([\w.]+)</code>")
_ANCHOR = re.compile(r'id="(streamjobs\.[\w.]+)"')
_CONSTANT = re.compile(r'<span title="(streamjobs\.[\w.]+)\.([A-Z][A-Z0-9_]+)">\2</span>')


def on_post_page(output: str, page: Any, **kwargs: Any) -> str:
    return readable(output)


def readable(content: str) -> str:
    """``content`` (a page's HTML) with its roles and named defaults made readable."""
    anchors = set(_ANCHOR.findall(content))

    def link(m: re.Match[str]) -> str:
        target = m[1].removeprefix("streamjobs.")
        found = [a for a in anchors if a == f"streamjobs.{target}" or a.endswith(f".{target}")]
        short = html.escape(target.rsplit(".", 1)[-1] if m[0].find("~") >= 0 else target)
        if len(found) == 1:
            return f'<a href="#{found[0]}"><code>{short}</code></a>'
        return f"<code>{short}</code>"

    def value(m: re.Match[str]) -> str:
        try:
            constant = getattr(importlib.import_module(m[1]), m[2])
        except (ImportError, AttributeError):
            return m[0]
        return f'<span title="{m[1]}.{m[2]}">{html.escape(repr(constant))}</span>'

    return _CONSTANT.sub(value, ROLE.sub(link, content))
