"""The documentation site builds with warnings as errors, and its reference pages
cannot drift from the code.

* `mkdocs build --strict` succeeds (broken links and anchors, missing snippet files and
  unreadable docstrings are errors), the API page is generated and every snippet of an
  example file is expanded in the built page.
* docs/configuration.md has one row per field of `ConsumerConfig` and `RecoveryConfig`
  with its default, and no row for a field that does not exist; its table of
  `streamjobs worker` options matches the parser.
* docs/api.md documents every name of `streamjobs.__all__`.
* docs/metrics.md, migration.md and changelog.md are the top-level METRICS.md,
  MIGRATION.md and CHANGELOG.md, put whole on the site by docs/hooks/top_level.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import streamjobs
from streamjobs import ConsumerConfig, GroupRetention, RecoveryConfig
from streamjobs.cli import _worker_args, env_name

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


@pytest.mark.parametrize(
    "cls", [ConsumerConfig, RecoveryConfig, GroupRetention], ids=lambda c: c.__name__
)
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
        # Each option's environment variable, as the worker reads it and its --help says.
        variable = f"`{env_name(m[1])}`" if m[1].startswith("--") else "—"
        assert row[4] == variable, f"{m[1]}: environment {row[4]}, the worker reads {variable}"
        if m[1].startswith("--"):
            assert f"[env {env_name(m[1])}]" in (actions[m[1]].help or ""), m[1]
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


def _hook() -> Any:
    spec = importlib.util.spec_from_file_location("top_level", DOCS / "hooks" / "top_level.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hook_puts_exactly_these_files_on_the_site() -> None:
    assert _hook().PAGES == SITE_PAGE_OF


def test_the_hook_rewrites_links_and_refuses_one_off_the_site() -> None:
    hook = _hook()
    text = "[a](docs/design.md#keys) [b](CHANGELOG.md) [c](https://x.org/y.md) [d](#here)"
    assert hook.for_the_site(text, "T.md") == (
        "[a](design.md#keys) [b](changelog.md) [c](https://x.org/y.md) [d](#here)"
    )
    with pytest.raises(hook.TopLevelLinkError, match=r"benchmarks/README\.md"):
        hook.for_the_site("[e](benchmarks/README.md)", "T.md")


@pytest.mark.parametrize("top", sorted(SITE_PAGE_OF))
def test_each_top_level_file_is_on_the_site_whole(top: str, site: Path) -> None:
    page = DOCS / SITE_PAGE_OF[top]
    assert f'--8<-- "{top}"' in page.read_text(encoding="utf-8").splitlines()
    built = (site / Path(SITE_PAGE_OF[top]).stem / "index.html").read_text(encoding="utf-8")
    source = (ROOT / top).read_text(encoding="utf-8")
    fenced = re.sub(r"^```.*?^```", "", source, flags=re.M | re.S)
    headings = [line for line in fenced.splitlines() if re.match(r"#{1,3} ", line)]
    assert headings, f"{top} has no headings"
    assert len(re.findall(r"<h[123][ >]", built)) == len(headings), f"{top} not all on the site"


def test_no_sphinx_role_or_named_default_shows_in_the_built_site(site: Path) -> None:
    """Docstrings use Sphinx roles and signatures name constants; the site shows
    neither (docs/hooks/api_text.py): a role is a link or plain code, a default is its
    value."""
    literal = re.compile(r":(?:meth|class|attr|func|data|exc|mod|obj|const):(?:<code>|`)")
    found = {
        str(page.relative_to(site)): literal.findall(page.read_text(encoding="utf-8"))
        for page in site.rglob("*.html")
    }
    assert {p: f for p, f in found.items() if f} == {}
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert '<a href="#streamjobs.HookFailed"><code>HookFailed</code></a>' in api
    assert ">DEFAULT_PREFIX<" not in api
    assert 'DEFAULT_PREFIX">&#x27;streamjobs&#x27;</span>' in api
