"""docs/grafana-dashboard.json parses, and every query in it (panels and variables)
names only metrics the recorder exports, with labels those metrics have."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .test_metrics_doc import registered

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
SUFFIXES = ("_bucket", "_count", "_sum")


def queries(node: Any) -> list[str]:
    """Every PromQL string in the dashboard: targets' ``expr`` and variables' queries."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            promql = key in ("expr", "definition") or (key == "query" and "(" in str(value))
            if promql and isinstance(value, str):
                found.append(value)
            else:
                found.extend(queries(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(queries(item))
    return found


def exported() -> dict[str, set[str]]:
    """Sample names a scrape shows (histograms: their three series), with labels."""
    out: dict[str, set[str]] = {}
    for name, (kind, labels) in registered().items():
        if kind == "histogram":
            out.update({name + s: labels | ({"le"} if s == "_bucket" else set()) for s in SUFFIXES})
        else:
            out[name] = labels
    return out


def test_every_dashboard_query_names_an_exported_metric_and_its_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["panels"], "no panels"
    exprs = queries(dashboard)
    assert len(exprs) >= len(dashboard["panels"])
    metrics = exported()
    used: set[str] = set()
    for expr in exprs:
        names = re.findall(r"\bstreamjobs_[a-z_]+", expr)
        assert names, f"a query with no streamjobs metric: {expr}"
        for name in names:
            assert name in metrics, f"{name} is not exported (query: {expr})"
            used.add(name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum"))
        for selector in re.findall(r"\{([^}]*)\}", expr):
            labels = set(re.findall(r"(\w+)\s*[=!]~?", selector))
            assert all(labels <= metrics[n] for n in names), f"unknown label in {expr}"
        for grouping in re.findall(r"by \(([^)]*)\)", expr):
            labels = {g.strip() for g in grouping.split(",")}
            assert all(labels <= metrics[n] for n in names), f"unknown label in {expr}"
    # Every metric is on the dashboard somewhere.
    base = {n for n in registered()}
    assert base - used == set(), "metrics missing from the dashboard"
