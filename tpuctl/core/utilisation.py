"""`tpu-metrics[-wN].json` in a run's record, beside its status (layout.run_chips): how busy worker N's accelerator
chips were while the run ran, sampled by its agent (host/chipsampler.py) every TPUCTL_TPU_METRICS_SECONDS and rewritten
whole each time (object stores cannot append), its history capped as metrics.json's is (metrics.thin):

    {"source": "tpu-info", "why": "", "every": 30.0, "time": T,
     "chips": [{"id": 0, "duty_cycle_pct": 97.1, "hbm_used": 12884901888, "hbm_total": 17179869184}, ...],
     "history": {"duty_cycle_pct": [[T, 96.4], ...], "hbm_used_gib": [[T, 12.0], ...]}}

`duty_cycle_pct` in the history is the mean over the host's chips, `hbm_used_gib` their sum. Where nothing answers
(no chips, tpu-info missing, a libtpu without its metrics service) `why` says so, written once, and the figures
show as "n/a (why)". `source` is "tpu-info" on a TPU host, "nvidia-smi" on a GPU host.

No third-party import here: the CLI reads this module.
"""
from __future__ import annotations

import json
from typing import Any

from .metrics import CAP, thin

LAST = 5   # the samples `tpuctl jobs` averages: the last few, so the figure is now's, not the run's whole mean
GIB = 1024 ** 3


def empty(every: float) -> dict[str, Any]:
    return {"source": "", "why": "", "every": every, "time": 0.0, "chips": [], "history": {}}


def record(doc: dict[str, Any], now: float, source: str, chips: list[dict[str, float]]) -> dict[str, Any]:
    """One sample of every chip on the host: the latest per chip, and the host's mean and sum into the history."""
    doc.update(source=source, why="", time=now, chips=chips)
    if chips:
        duty = sum(c["duty_cycle_pct"] for c in chips) / len(chips)
        used = sum(c.get("hbm_used", 0.0) for c in chips) / GIB
        hist = doc.setdefault("history", {})
        for name, value in (("duty_cycle_pct", duty), ("hbm_used_gib", used)):
            hist[name] = thin(hist.get(name, []) + [[round(now, 1), round(value, 3)]], CAP)
    return doc


def parse(raw: bytes | None) -> dict[str, Any] | None:
    """The file as read from the store; None when absent or unreadable."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def recent_duty(doc: dict[str, Any] | None) -> float | None:
    """The mean duty cycle of the last LAST samples, or None when none was taken."""
    points = ((doc or {}).get("history") or {}).get("duty_cycle_pct") or []
    last = [float(v) for _, v in points[-LAST:]]
    return sum(last) / len(last) if last else None


def shown(doc: dict[str, Any] | None) -> str:
    """What `jobs` and the page show: "97%", "n/a (why)", or "" for a run no agent sampled (an older agent)."""
    if doc is None:
        return ""
    duty = recent_duty(doc)
    if duty is not None:
        return f"{duty:.0f}%"
    return f"n/a ({doc.get('why') or 'no sample yet'})"
