"""METRICS.md and the metrics PrometheusRecorder registers agree, in both directions:
names, types and labels."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from streamjobs import PrometheusRecorder

DOC = Path(__file__).resolve().parents[2] / "METRICS.md"


def documented() -> dict[str, tuple[str, set[str]]]:
    rows: dict[str, tuple[str, set[str]]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`streamjobs_[a-z_]+`", cells[0]):
            labels = set(re.findall(r"`([a-z_]+)`", cells[2]))
            rows[cells[0].strip("`")] = (cells[1], labels)
    return rows


def registered() -> dict[str, tuple[str, set[str]]]:
    registry = CollectorRegistry()
    PrometheusRecorder(registry)
    out: dict[str, tuple[str, set[str]]] = {}
    for collector in list(registry._collector_to_names):  # every metric, even unused
        for family in collector.describe():  # type: ignore[attr-defined]
            name = family.name + ("_total" if family.type == "counter" else "")
            out[name] = (family.type, set(getattr(collector, "_labelnames", ())))
    return out


def test_metrics_md_lists_exactly_what_the_recorder_registers() -> None:
    doc, code = documented(), registered()
    assert doc, "METRICS.md has no metric rows"
    assert sorted(set(code) - set(doc)) == [], "registered but not in METRICS.md"
    assert sorted(set(doc) - set(code)) == [], "in METRICS.md but not registered"
    for name, (kind, labels) in code.items():
        assert doc[name] == (kind, labels), f"{name}: METRICS.md says {doc[name]}"


def test_the_recorder_never_touches_the_global_registry() -> None:
    from prometheus_client import REGISTRY

    before = set(REGISTRY._names_to_collectors)
    PrometheusRecorder()
    PrometheusRecorder()  # a second one does not clash either
    assert set(REGISTRY._names_to_collectors) == before
