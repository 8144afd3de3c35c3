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

import math
from typing import Any

from . import jobfiles
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
    try:
        return parse_or_why(raw)
    except jobfiles.Unreadable:
        return None


MAX_CHIPS = 1024   # more than any host has: a longer list is a broken file's


def parse_or_why(raw: bytes | None) -> dict[str, Any] | None:
    """parse(), the file kept to what tpuctl reads of it, each figure a finite number (a sampler that wrote NaN, a
    file edited by hand: never shown, never passed on as invalid JSON), its history thinned to the cap;
    jobfiles.Unreadable says what is wrong with a file that is no such record."""
    if not raw:
        return None
    doc = jobfiles.loads(raw)
    if not isinstance(doc, dict):
        raise jobfiles.Unreadable("not a JSON object")
    chips: list[Any] = doc["chips"] if isinstance(doc.get("chips"), list) else []
    hist: dict[str, Any] = doc["history"] if isinstance(doc.get("history"), dict) else {}
    return {"source": str(doc.get("source") or "")[:40], "why": str(doc.get("why") or "")[:500],
            "every": _num(doc.get("every")) or 0.0, "time": _num(doc.get("time")) or 0.0,
            "chips": [{str(k): v for k, v in c.items() if _num(v) is not None}
                      for c in chips[:MAX_CHIPS] if isinstance(c, dict)],
            "history": {name: thin([[float(p[0]), float(p[1])] for p in points if _point(p)], CAP)
                        for name in ("duty_cycle_pct", "hbm_used_gib")
                        if isinstance(points := hist.get(name), list)}}


def load(store: Any, key: str) -> tuple[dict[str, Any] | None, str]:
    """The file read no further than jobfiles' cap, and what is wrong with it ("" when nothing)."""
    name = key.rsplit("/", 1)[-1]
    try:
        return parse_or_why(jobfiles.read(store, key)), ""
    except jobfiles.Unreadable as e:
        said = str(e)
        return None, said if said.startswith(name) else f"{name} is unreadable: {said}"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _point(p: Any) -> bool:
    return isinstance(p, list) and len(p) == 2 and _num(p[0]) is not None and _num(p[1]) is not None


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
