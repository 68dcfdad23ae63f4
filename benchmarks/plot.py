"""Charts of a benchmark run: ``python -m benchmarks --plot``.

Reads ``results.json`` (written by ``python -m benchmarks``; nothing is run again) and
draws three PNG charts into a folder (by default ``docs/img/benchmarks``, for
benchmarks/README.md and the docs site):

* ``ratios.png``: each scenario's throughput as a fraction of the bare redis-py loop
  that does the same work (hot stream and many streams, standalone and cluster, with
  their targets), and beside it the peer libraries on the hot stream;
* ``idle_cost.png``: what idle owned streams cost against how many there are (RSS per
  stream, Redis commands per second, connections), one point per ``idle_cost*`` run;
* ``recovery.png``: the distribution of recovery latencies after a kill -9 or a stall
  (``recovery_latency``'s deciles), against its target.

A chart whose scenarios are missing from the run is left out with a note; the others
are still drawn. The numbers come from the tables the scenarios printed, so a chart
always shows the run it was drawn from.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / "docs" / "img" / "benchmarks"

RATIO_SCENARIOS = {
    "hot_stream": ("hot stream", 0.7),
    "hot_stream_bytes": ("hot stream, bytes mode", 0.8),
    "hot_stream_cluster": ("hot stream, cluster", 0.7),
    "many_streams": ("many streams", 0.45),
    "many_streams_cluster": ("many streams, cluster", 0.45),
}
"""scenario -> (label, target ratio to the bare loop; docs/ and benchmarks/README.md)"""

IDLE_TARGETS = {"RSS per stream": 10.0, "Redis commands/s in the window": 550.0}
"""The idle targets at 10,000 streams: KiB per stream, commands per second."""


class NoData(Exception):
    """The run has none of the scenarios a chart needs."""


@dataclass(frozen=True)
class Chart:
    name: str
    path: Path | None
    note: str = ""


def number(cell: str) -> float:
    """A table cell as a number: ``"35,224"`` -> 35224.0, ``"10.2 KiB"`` -> 10.2."""
    match = re.search(r"-?[\d,]*\.?\d+", cell)
    if match is None:
        raise ValueError(f"no number in {cell!r}")
    return float(match[0].replace(",", ""))


def _runs(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["scenario"]: r for r in results["runs"] if r["exit_code"] == 0 and r["tables"]}


def ratios(results: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """(scenario label -> median ratio streamjobs/bare, peer -> its ratio to bare)."""
    runs = _runs(results)
    ours: dict[str, float] = {}
    for scenario, (label, _) in RATIO_SCENARIOS.items():
        run = runs.get(scenario)
        if run is None:
            continue
        rows = [r for r in run["tables"][0] if r.get("round", "").isdigit()]
        if rows:
            ours[label] = statistics.median(number(r["ratio streamjobs/bare"]) for r in rows)
    peers: dict[str, float] = {}
    if "peers" in runs:
        for row in runs["peers"]["tables"][0]:
            if row["contender"] != "bare":
                peers[row["contender"]] = number(row["contender/bare"])
    return ours, peers


def idle_points(
    results: dict[str, Any], *, cluster: bool = False
) -> list[tuple[int, dict[str, float]]]:
    """(streams, {column: value}) per ``idle_cost*`` run, by number of streams: the
    standalone runs, or those on a cluster (``--cluster``)."""
    points = []
    for scenario, run in _runs(results).items():
        if not scenario.startswith("idle_cost"):
            continue
        command = run["command"]
        if ("--cluster" in command) != cluster:
            continue
        streams = int(command[command.index("--streams") + 1]) if "--streams" in command else 2000
        row = run["tables"][0][-1]  # the last liveness measured (session by default)
        values = {k: number(v) for k, v in row.items() if k != "liveness"}
        points.append((streams, values))
    return sorted(points, key=lambda p: p[0])


def recovery_deciles(results: dict[str, Any]) -> dict[str, tuple[list[float], float]]:
    """ "kill, 100,000 unrelated keys" -> (p0..p100 seconds, target seconds)."""
    run = _runs(results).get("recovery_latency")
    if run is None or len(run["tables"]) < 2:
        return {}
    summary = {(r["scenario"], r["unrelated TTL keys"]): r for r in run["tables"][0]}
    out = {}
    for row in run["tables"][1]:
        key = (row["scenario"], row["unrelated TTL keys"])
        deciles = [number(row[f"p{10 * q} s"]) for q in range(11)]
        streams, target = "?", float("nan")
        if key in summary:
            streams, target = summary[key]["streams"], number(summary[key]["target s"])
        out[f"{key[0]}, {key[1]} unrelated keys, {streams} streams"] = (deciles, target)
    return out


def _pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (the bench extra; imported on first
    use, so that reading the tables needs no matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")  # no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def _subtitle(results: dict[str, Any]) -> str:
    about = results.get("machine", {})
    server = str(about.get("server", "?"))
    # "Redis server v=7.0.15 sha=... build=..." -> "Redis server 7.0.15": the title fits.
    version = re.search(r"\bv=(\S+)", server)
    if version:
        server = f"{server.split(' v=')[0]} {version.group(1)}"
    return f"{about.get('date', '?')}, {about.get('cpus', '?')} CPUs, {server}"


def ratio_chart(results: dict[str, Any]) -> Figure:
    ours, peers = ratios(results)
    if not ours and not peers:
        raise NoData("no hot_stream, many_streams or peers run")
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), width_ratios=(1.1, 1))
    labels = list(ours)
    left.barh(labels, [ours[k] for k in labels], color="#3b6ea8")
    targets = {label: target for label, target in RATIO_SCENARIOS.values()}
    for y, label in enumerate(labels):
        left.plot([targets[label]] * 2, [y - 0.4, y + 0.4], color="#c0392b", lw=2)
        left.text(ours[label] + 0.01, y, f"{ours[label]:.2f}", va="center", fontsize=9)
    left.axvline(1.0, color="grey", lw=0.8, ls="--")
    left.set_xlim(0, max(1.1, *ours.values(), 0.0) + 0.1)
    left.invert_yaxis()
    left.set_xlabel("entries/s as a fraction of the bare redis-py loop (red: target)")
    left.set_title("streamjobs against the bare loop (median of rounds)")
    names = sorted(peers, key=peers.__getitem__, reverse=True)
    right.barh(
        names,
        [peers[n] for n in names],
        color=["#3b6ea8" if n == "streamjobs" else "#999999" for n in names],
    )
    right.set_xscale("log")
    from matplotlib.ticker import NullFormatter

    right.xaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels overlap
    for y, n in enumerate(names):
        right.text(peers[n] * 1.1, y, f"{peers[n]:.3f}", va="center", fontsize=9)
    if names:
        right.set_xlim(min(peers.values()) / 2, max(1.0, *peers.values()) * 2)
    right.invert_yaxis()
    right.set_xlabel("fraction of the bare loop (log scale)")
    right.set_title("one hot stream: libraries")
    fig.suptitle(f"Throughput: {_subtitle(results)}", fontsize=9)
    fig.tight_layout()
    return cast("Figure", fig)


def idle_chart(results: dict[str, Any]) -> Figure:
    points = idle_points(results)
    if not points:
        raise NoData("no idle_cost run")
    plt = _pyplot()
    columns = ("RSS per stream", "Redis commands/s in the window", "connections")
    units = ("KiB per stream", "Redis commands/s", "connections")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    series = [("standalone", points, "#3b6ea8")]
    on_cluster = idle_points(results, cluster=True)
    if on_cluster:
        series.append(("3 + 3 cluster (busiest primary)", on_cluster, "#e67e22"))
    for ax, column, unit in zip(axes, columns, units, strict=True):
        for label, found, color in series:
            xs = [p[0] for p in found]
            ys = [p[1].get(column, float("nan")) for p in found]
            ax.plot(xs, ys, marker="o", color=color, label=label)
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(f"{y:g}", (x, y), textcoords="offset points", xytext=(0, 6), fontsize=8)
        if column in IDLE_TARGETS:
            ax.axhline(IDLE_TARGETS[column], color="#c0392b", lw=1, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("idle owned streams, one consumer")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
    axes[0].set_title("memory (red: target)")
    axes[1].set_title("Redis load (red: target)")
    axes[2].set_title("connections")
    if len(series) > 1:
        axes[2].legend(fontsize=8)
    fig.suptitle(f"Idle cost, default liveness: {_subtitle(results)}", fontsize=9)
    fig.tight_layout()
    return cast("Figure", fig)


def recovery_chart(results: dict[str, Any]) -> Figure:
    series = recovery_deciles(results)
    if not series:
        raise NoData("no recovery_latency run with its deciles table")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    fractions = [q / 10 for q in range(11)]
    for label, (deciles, _) in series.items():
        ax.step(deciles, fractions, where="post", marker=".", label=label)
    targets = {t for _, t in series.values()}
    for target in targets:
        ax.axvline(target, color="#c0392b", lw=1, ls="--")
    ax.set_xlabel("seconds from the kill (or stop) until another consumer resumed a stream")
    ax.set_ylabel("fraction of the streams resumed")
    ax.set_title("Recovery latency of each stream (red: target, lock TTL + 1 s)")
    ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(_subtitle(results), fontsize=9)
    fig.tight_layout()
    return cast("Figure", fig)


CHARTS = {"ratios": ratio_chart, "idle_cost": idle_chart, "recovery": recovery_chart}


def draw(results_path: Path, out_dir: Path = DEFAULT_DIR) -> list[Chart]:
    """Draw every chart of ``results_path`` into ``out_dir``; what was drawn or skipped."""
    try:
        results = json.loads(results_path.read_text())
    except FileNotFoundError:
        raise SystemExit(
            f"{results_path} not found: run 'python -m benchmarks' first "
            "(--plot draws an earlier run's results)"
        ) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    charts = []
    for name, make in CHARTS.items():
        try:
            fig = make(results)
        except NoData as exc:
            charts.append(Chart(name, None, f"skipped: {exc}"))
            continue
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        charts.append(Chart(name, path))
    return charts


def report(charts: Sequence[Chart]) -> None:
    for chart in charts:
        print(f"{chart.name}: {chart.path if chart.path else chart.note}")
