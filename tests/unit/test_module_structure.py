"""The package's structure, read from its source (nothing is imported): no module over
500 lines, no import cycle, import chains kept short, and docs/design.md's module map
naming every module (docs/design.md#module-map)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "streamjobs"

MAX_LINES = 500
MAX_CHAIN = 14
"""The most modules one chain of imports may pass through (every import counted:
lazy and type-checking ones too; the package's ``__init__`` aside). Modules import
from the ``_redis`` module that defines a name, not through the package's re-exports,
and see their collaborators through protocols: a chain stays as deep as the layers."""


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its body."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target not in (name, "streamjobs"):
                out.add(target)
    return out


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    modules = _modules()
    return {
        name: frozenset(_imports(name, path, modules))
        for name, path in modules.items()
        if name != "streamjobs"
    }


def test_no_module_is_over_500_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    assert {path: n for path, n in sizes.items() if n > MAX_LINES} == {}


def test_no_import_cycle_and_short_chains() -> None:
    graph = _graph()
    longest: dict[str, list[str]] = {}

    def chain(name: str, stack: tuple[str, ...]) -> list[str]:
        if name in stack:
            cycle = [*stack[stack.index(name) :], name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name not in longest:
            below = [chain(dep, (*stack, name)) for dep in sorted(graph.get(name, ()))]
            longest[name] = [name, *max(below, key=len, default=[])]
        return longest[name]

    worst = max((chain(name, ()) for name in sorted(graph)), key=len)
    assert len(worst) <= MAX_CHAIN, " -> ".join(worst)


def test_the_module_map_names_every_module() -> None:
    """Every module has a row in docs/design.md's module map (a package's folder row
    covers its modules when none of them has a row of its own), and every row names a
    module that exists."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    table = text.split("## Module map", 1)[1]
    named: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            named.update(re.findall(r"`([^`]+)`", first))
    paths = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    missing = set()
    for path in paths:
        folder = path.rpartition("/")[0] + "/" if "/" in path else ""
        own_rows = {n for n in named if folder and n.startswith(folder) and n != folder}
        covered = path in named or (
            folder in named and (not own_rows or path.endswith("__init__.py"))
        )
        if not covered and path != "__init__.py":
            missing.add(path)
    assert missing == set(), "modules without a row in docs/design.md#module-map"
    stale = {
        n
        for n in named
        if (n.endswith(".py") and n not in paths)
        or (n.endswith("/") and not (PACKAGE / n).is_dir())
    }
    assert stale == set(), "rows naming no module"
