"""The documentation site builds with warnings as errors, and its reference pages
cannot drift from the code.

* `mkdocs build --strict` succeeds (broken links and anchors, missing snippet files and
  unreadable docstrings are errors), the API page is generated and every snippet of an
  example file is expanded in the built page.
* docs/configuration.md has one row per field of `ConsumerConfig` and `RecoveryConfig`
  with its default, and no row for a field that does not exist; its table of
  `streamjobs worker` options matches the parser.
* docs/api.md documents every name of `streamjobs.__all__`.
* docs/metrics.md, migration.md and changelog.md reproduce the top-level METRICS.md,
  MIGRATION.md and CHANGELOG.md, with only link targets changed to work on the site.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import html
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import streamjobs
from streamjobs import ConsumerConfig, RecoveryConfig
from streamjobs.cli import _worker_args

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BUILD_TIMEOUT_S = 600

# --8<-- "path" or --8<-- "path:start:end" alone on a (maybe indented) line: pymdownx.snippets.
SNIPPET = re.compile(
    r'^\s*-{1,}8<-{1,}\s+"(?P<path>[^":]+)(?::(?P<start>\d*)(?::(?P<end>\d*))?)?"\s*$'
)
# Top-level files that have a page of their own on the site.
SITE_PAGE_OF = {
    "METRICS.md": "metrics.md",
    "MIGRATION.md": "migration.md",
    "CHANGELOG.md": "changelog.md",
}


# -- the build ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's banner
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env=env,
    )
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return out


def page_text(site: Path, page: str) -> str:
    """The text of a built page (``api.md`` -> ``api/index.html``), tags removed."""
    built = site / ("index.html" if page == "index.md" else f"{page[:-3]}/index.html")
    assert built.is_file(), f"{page} was not built"
    return html.unescape(re.sub(r"<[^>]+>", "", built.read_text(encoding="utf-8")))


def snippets(page: Path) -> list[tuple[str, int | None, int | None]]:
    """(path, first line, last line) of each snippet a docs page includes."""
    found = []
    for line in page.read_text(encoding="utf-8").splitlines():
        if m := SNIPPET.match(line):
            start = int(m["start"]) if m["start"] else None
            end = int(m["end"]) if m["end"] else None
            found.append((m["path"], start, end))
    return found


@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
def test_the_site_builds_strict_with_the_api_reference(site: Path) -> None:
    text = page_text(site, "api.md")
    assert "StreamConsumer" in text
    # Docstrings rendered, not just names: the class docstring and an Args entry.
    assert "Base class of a consumer" in text
    assert "consumers of one service share the work" in text
    assert "How one consumer owns and processes streams" in text  # ConsumerConfig
    built = (site / "api" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in streamjobs.__all__ if f'id="streamjobs.{name}"' not in built]
    assert not missing, f"no API entry was generated for {missing}"


@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
def test_every_example_snippet_is_expanded_in_the_built_page(site: Path) -> None:
    expanded = 0
    for page in sorted(DOCS.glob("*.md")):
        text = page_text(site, page.name)
        for path, start, end in snippets(page):
            if not path.startswith("examples/"):
                continue
            lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
            lines = lines[(start or 1) - 1 : end]
            missing = [ln.strip() for ln in lines if ln.strip() and ln.strip() not in text]
            assert not missing, f"{page.name}: {path} not expanded, e.g. {missing[:3]}"
            expanded += 1
    assert expanded, "no page includes an example file"
    getting_started = page_text(site, "getting-started.md")
    assert "class Greeter(StreamConsumer):" in getting_started  # examples/minimal/consumer.py


def test_getting_started_includes_the_minimal_consumer_and_the_fleet() -> None:
    included = {path for path, _, _ in snippets(DOCS / "getting-started.md")}
    assert {"examples/minimal/consumer.py", "examples/fleet/handlers.py"} <= included


# -- the configuration reference ------------------------------------------------------------


def cells(line: str) -> list[str]:
    """The cells of a markdown table row (pipes escaped as \\| stay inside a cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def section_rows(doc: str, heading: str) -> list[list[str]]:
    """The table rows under ``## heading`` (up to the next ``## ``), header excluded."""
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", doc, re.M | re.S)
    assert m, f"docs/configuration.md has no section '## {heading}'"
    lines = m[1].splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith("|")), len(lines))
    rows = []
    for ln in lines[first:]:  # the first table of the section
        if not ln.startswith("|"):
            break
        rows.append(cells(ln))
    assert len(rows) > 2, f"section '{heading}' has no table"
    return rows[2:]  # the header and the |---| line


def rendered(default: Any) -> str:
    """How the reference writes a default: `"text"`, `Liveness.LOCK`, `None`, `10.0`."""
    if isinstance(default, str):
        return f'`"{default}"`'
    if isinstance(default, enum.Enum):
        return f"`{type(default).__name__}.{default.name}`"
    return f"`{default!r}`"


def configuration() -> str:
    return (DOCS / "configuration.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("cls", [ConsumerConfig, RecoveryConfig], ids=lambda c: c.__name__)
def test_configuration_reference_has_exactly_the_fields_with_their_defaults(cls: type) -> None:
    rows = section_rows(configuration(), cls.__name__)
    documented: dict[str, list[str]] = {}
    for row in rows:
        m = re.fullmatch(r"`([a-z_][a-z0-9_]*)`", row[0])
        assert m, f"{cls.__name__} row does not start with a field name in backticks: {row}"
        assert m[1] not in documented, f"{cls.__name__}.{m[1]} has two rows"
        documented[m[1]] = row
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert sorted(set(fields) - set(documented)) == [], "fields missing from the reference"
    assert sorted(set(documented) - set(fields)) == [], "rows naming no field"
    for name, f in fields.items():
        row = documented[name]
        assert len(row) == 5, f"{name}: expected field | type | unit | default | rule"
        assert f.default is not dataclasses.MISSING, f"{name} has no plain default"
        assert rendered(f.default) in row[3], f"{name}: default {rendered(f.default)} not shown"
        assert row[4], f"{name}: no rule"


def test_worker_options_table_matches_the_parser() -> None:
    parser = argparse.ArgumentParser()
    _worker_args(parser.add_subparsers())
    worker = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "worker"
    ]
    actions = {opt: a for a in worker._actions for opt in a.option_strings or [a.metavar] if opt}
    actions.pop("-h"), actions.pop("--help")
    fields = {f.name for cls in (ConsumerConfig, RecoveryConfig) for f in dataclasses.fields(cls)}
    rows = section_rows(configuration(), "`streamjobs worker` options")
    documented = {}
    for row in rows:
        m = re.fullmatch(r"`([^`]+)`", row[0])
        assert m, f"worker option row does not start with the option in backticks: {row}"
        documented[m[1]] = row[1]
    assert sorted(set(actions) - set(documented)) == [], "worker options not documented"
    assert sorted(set(documented) - set(actions)) == [], "documented options that do not exist"
    for option, field_cell in documented.items():
        dest = actions[option].dest
        if field_cell != "—":
            assert field_cell.strip("`") in fields, f"{option}: no field {field_cell}"
        if dest in fields:
            assert field_cell == f"`{dest}`", f"{option} sets {dest}, the table says {field_cell}"


# -- the API page and the included top-level files ------------------------------------------------


def test_api_page_documents_every_public_name() -> None:
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: streamjobs\.(\w+)\s*$", api, re.M))
    assert sorted(set(streamjobs.__all__) - documented) == [], "public names missing from api.md"
    assert sorted(documented - set(streamjobs.__all__)) == [], "api.md names non-public objects"


def for_the_site(text: str, name: str) -> str:
    """A top-level file's text with each relative link target made relative to docs/."""

    def target(m: re.Match[str]) -> str:
        url = m[1]
        path, _, anchor = url.partition("#")
        if re.match(r"[a-z]+:", url) or not path:  # external, or an anchor on the page
            return m[0]
        if path.startswith("docs/"):
            new = path.removeprefix("docs/")
        elif path in SITE_PAGE_OF:
            new = SITE_PAGE_OF[path]
        else:
            pytest.fail(f"{name} links to {path}, which is not on the site")
        return f"]({new}{'#' + anchor if anchor else ''})"

    return re.sub(r"\]\(([^)\s]+)\)", target, text)


@pytest.mark.parametrize("top", sorted(SITE_PAGE_OF))
def test_included_page_reproduces_the_top_level_file(top: str) -> None:
    page = DOCS / SITE_PAGE_OF[top]
    source = page.read_text(encoding="utf-8")
    source = re.sub(r"\A<!--.*?-->\n", "", source, flags=re.S)  # the note for editors
    original = (ROOT / top).read_text(encoding="utf-8").splitlines()
    expanded: list[str] = []
    for line in source.splitlines():
        m = SNIPPET.match(line)
        if m is None:
            expanded.append(line)
            continue
        assert m["path"] == top, f"{page.name} includes {m['path']}"
        start = int(m["start"]) if m["start"] else 1
        end = int(m["end"]) if m["end"] else None
        expanded.extend(original[start - 1 : end])
    expected = for_the_site("\n".join(original), top).splitlines()
    assert expanded == expected, (
        f"docs/{page.name} no longer equals {top} with its links made relative to docs/: "
        f"{top} changed; update the line ranges and the lines written out in docs/{page.name}"
    )
