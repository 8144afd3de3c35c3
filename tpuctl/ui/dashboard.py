"""The Grafana dashboard shipped for /metrics (grafana/tpuctl-dashboard.json; `tpuctl ui --grafana-dashboard`
prints it): a fleet row (runs by state, dollars an hour, budget left, each chip's duty cycle as a heat map, `up`'s
provisioning time) and a run row (loss, step, step time, goodput windows, badput by kind, cost), templated on the
Prometheus data source, the cluster and the run. Classic dashboard JSON (grafana.com/docs/grafana/latest/dashboards/
build-dashboards/view-dashboard-json-model), which Grafana imports as it is (Dashboards > New > Import) or
provisions from a file; its queries name only metrics ui/metrics.py exports (tests/test_metrics_export.py)."""
from __future__ import annotations

import json
from importlib import resources
from typing import Any

FILE = "tpuctl-dashboard.json"


def text() -> str:
    return (resources.files("tpuctl.ui") / "grafana" / FILE).read_text()


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(text())
    return doc


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every panel's every target, rows' nested panels included."""
    out = []
    for p in doc.get("panels", []):
        for q in [p] + list(p.get("panels", [])):
            out += [(str(q.get("title")), str(t["expr"])) for t in q.get("targets", []) if t.get("expr")]
    return out
