"""Every benchmark in one command: ``python -m benchmarks``.

Runs each scenario as its own process (``python -m benchmarks.<name>``, each starting
its own private server), one after the other so they never share the CPU, and writes:

* ``--out DIR/results.json``: per scenario the command, exit code, wall time, the
  machine and versions, and every markdown table it printed, parsed into rows;
* ``--out DIR/results.md``: the same as markdown, ready for benchmarks/README.md.

``--quick`` runs every scenario at its smoke-test size (seconds, no meaningful
numbers); the default is each scenario's full size (about 15 minutes on a 2-core VM,
plus the cluster runs). ``--only a,b`` picks scenarios. A scenario that fails is
reported and the others run; the exit code is 1 if any failed. A scenario past
``--timeout`` gets SIGTERM (the benchmarks then stop their private servers and
clusters), SIGKILL only if it has not exited 30 s later.

``hot_stream_bytes`` runs ``hot_stream`` with ``--bytes`` (streamjobs in bytes mode);
``hot_stream_cluster`` and ``many_streams_cluster`` run ``hot_stream`` and
``many_streams`` with ``--cluster``: on a private 3-primary + 3-replica Redis Cluster;
``idle_cost_500`` and ``idle_cost_2000`` run ``idle_cost`` with fewer streams, so that
the idle cost can be drawn against the number of streams; ``idle_cost_cluster`` runs it
on a private cluster.

``--plot`` runs nothing: it draws the charts of ``DIR/results.json`` (an earlier run)
into ``docs/img/benchmarks`` (``--charts DIR`` elsewhere), see benchmarks/plot.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# scenario -> (full-size arguments, smoke-size arguments)
SCENARIOS: dict[str, tuple[list[str], list[str]]] = {
    "hot_stream": ([], ["--entries", "2000", "--rounds", "2"]),
    "hot_stream_bytes": (["--bytes"], ["--entries", "2000", "--rounds", "2", "--bytes"]),
    "many_streams": ([], ["--streams", "20", "--entries", "3", "--rounds", "2"]),
    "shared_group": (
        [],
        ["--entries", "2000", "--rounds", "2", "--processes", "1,2", "--process-entries", "2000"],
    ),
    "idle_cost": (
        # Liveness.LOCK is not meant for 10,000 streams (benchmarks/README.md, idle cost).
        ["--streams", "10000", "--liveness", "session"],
        ["--streams", "30", "--wakeups", "5", "--window-s", "0.5"],
    ),
    "idle_cost_500": (
        ["--streams", "500", "--liveness", "session"],
        ["--streams", "10", "--wakeups", "5", "--window-s", "0.5", "--liveness", "session"],
    ),
    "idle_cost_2000": (
        ["--streams", "2000", "--liveness", "session"],
        ["--streams", "20", "--wakeups", "5", "--window-s", "0.5", "--liveness", "session"],
    ),
    "idle_cost_cluster": (
        ["--streams", "10000", "--liveness", "session", "--cluster"],
        ["--streams", "20", "--wakeups", "5", "--window-s", "0.5", "--cluster"],
    ),
    "scan_cost": ([], ["--assignments", "300", "--passes", "2"]),
    "big_entries": ([], ["--entries", "3", "--mb", "1"]),
    "status_cost": ([], ["--streams", "30", "--dead", "5", "--rounds", "2"]),
    "recovery_latency": ([], ["--streams", "3", "--ttl", "1", "--unrelated", "0"]),
    "peers": (["--entries", "20000"], ["--entries", "50", "--rounds", "1"]),
    "hot_stream_cluster": (
        ["--entries", "50000", "--rounds", "3", "--cluster"],
        ["--entries", "2000", "--rounds", "2", "--cluster"],
    ),
    "many_streams_cluster": (
        ["--streams", "2000", "--rounds", "3", "--cluster"],
        ["--streams", "20", "--entries", "3", "--rounds", "2", "--cluster"],
    ),
}

# scenario -> the module it runs, where that is not the scenario's own name
MODULES: dict[str, str] = {
    "hot_stream_bytes": "hot_stream",
    "hot_stream_cluster": "hot_stream",
    "many_streams_cluster": "many_streams",
    "idle_cost_500": "idle_cost",
    "idle_cost_2000": "idle_cost",
    "idle_cost_cluster": "idle_cost",
}

TERM_GRACE_S = 30.0
"""After SIGTERM, how long a timed-out scenario gets to stop its servers."""


@dataclass
class Run:
    scenario: str
    command: list[str]
    exit_code: int
    seconds: float
    tables: list[list[dict[str, str]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Output lines that are not table rows (summaries, medians)."""


def parse_tables(text: str) -> tuple[list[list[dict[str, str]]], list[str]]:
    """Markdown tables in ``text`` as lists of {header: cell}, and the other lines."""
    tables: list[list[dict[str, str]]] = []
    notes: list[str] = []
    header: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("|"):
            header = None
            if stripped:
                notes.append(stripped)
            continue
        cells = [c.strip() for c in stripped.strip("|").split("|")]
        if header is None:
            header = cells
            tables.append([])
        elif all(set(c) <= set("-: ") for c in cells):
            continue
        else:
            tables[-1].append(dict(zip(header, cells, strict=False)))
    return tables, notes


def run(scenario: str, args: list[str], timeout_s: float) -> Run:
    module = MODULES.get(scenario, scenario)
    command = [sys.executable, "-m", f"benchmarks.{module}", *args]
    print(f"== {scenario}: {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
            code, out = proc.returncode, stdout + stderr
        except subprocess.TimeoutExpired:
            # SIGTERM first: the benchmark stops its private server or cluster on it.
            proc.send_signal(signal.SIGTERM)
            try:
                stdout, stderr = proc.communicate(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate()
            code, out = 124, f"timed out after {timeout_s:g}s\n{stdout}{stderr}"
    seconds = time.perf_counter() - started
    print(out, flush=True)
    tables, notes = parse_tables(out)
    return Run(scenario, command[1:], code, round(seconds, 1), tables, notes)


def machine() -> dict[str, Any]:
    import redis

    import streamjobs
    from streamjobs.testing import server_binary

    binary = server_binary()
    server = "none found"
    if binary is not None:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True)
        server = version.stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "streamjobs": streamjobs.__version__,
        "server": server,
    }


def to_markdown(about: dict[str, Any], runs: Sequence[Run]) -> str:
    lines = [
        "# Benchmark results",
        "",
        ", ".join(f"{k}: {v}" for k, v in about.items()),
        "",
    ]
    for r in runs:
        status = "ok" if r.exit_code == 0 else f"FAILED (exit {r.exit_code})"
        lines += [
            f"## {r.scenario} ({status}, {r.seconds:g} s)",
            "",
            f"`{' '.join(r.command)}`",
            "",
        ]
        for table in r.tables:
            if not table:
                continue
            headers = list(table[0])
            lines.append("| " + " | ".join(headers) + " |")
            lines.append("|" + "---|" * len(headers))
            lines += ["| " + " | ".join(row.get(h, "") for h in headers) + " |" for row in table]
            lines.append("")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- latest-run -->", "<!-- /latest-run -->"


def update_readme(path: Path, markdown: str) -> None:
    """Replace what lies between the latest-run markers of ``path`` (headings demoted
    two levels, to sit under the README's own)."""
    body = re.sub(r"^(#+) ", lambda m: "#" * (len(m[1]) + 2) + " ", markdown, flags=re.M)
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{body}{END}{tail}", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes")
    parser.add_argument("--only", default=None, help="comma-separated scenarios")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per scenario, seconds")
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="put this run's tables in benchmarks/README.md (between its latest-run markers)",
    )
    parser.add_argument(
        "--plot",
        action="store_true",
        help="run nothing: draw the charts of DIR/results.json (an earlier run; DIR is --out)",
    )
    parser.add_argument(
        "--charts", type=Path, default=None, help="where --plot writes (docs/img/benchmarks)"
    )
    ns = parser.parse_args(argv)
    if ns.plot:
        from benchmarks import plot  # matplotlib: the bench extra

        charts = plot.draw(ns.out / "results.json", ns.charts or plot.DEFAULT_DIR)
        plot.report(charts)
        return 0 if any(c.path for c in charts) else 1
    names = list(SCENARIOS) if ns.only is None else ns.only.split(",")
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    runs = [run(n, SCENARIOS[n][1 if ns.quick else 0], ns.timeout) for n in names]
    about = machine() | {"sizes": "quick" if ns.quick else "full"}
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "results.json").write_text(
        json.dumps({"machine": about, "runs": [asdict(r) for r in runs]}, indent=2) + "\n"
    )
    (ns.out / "results.md").write_text(to_markdown(about, runs))
    print(f"wrote {ns.out / 'results.json'} and {ns.out / 'results.md'}")
    if ns.update_readme:
        update_readme(ROOT / "benchmarks" / "README.md", to_markdown(about, runs))
    return 0 if all(r.exit_code == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
