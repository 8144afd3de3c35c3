"""`metrics.json` in a run's output directory: the job's latest step and metrics and a capped history of each,
rewritten whole at every log interval (object stores cannot append). The job writes it through
`tpuctl.runtime.metrics_callback()`; `tpuctl jobs` reads it for the step, the loss and a sparkline.

    {"step": 120, "metrics": {"loss": 6.91, ...}, "history": {"loss": [[10, 8.01], [20, 7.49], ...], ...},
     "attempts": [{"start": T, "from": 0, "step": 120, "last": T, "step_seconds": 98.2, "calls": 120,
                   "first_seconds": 9.1, "checkpoint_seconds": 4.0}, ...]}

`attempts` is what goodput (goodput.py) is computed from: each start of the job's training (a resume after a
preemption is a new one), the step it started from, the last step it reached and when, the time it spent inside
training steps (in `calls` reports, the first of them `first_seconds`: compilation lands there), and the time its
blocking checkpoint saves took. Files written before the last three existed read as without them.

No TensorFlow here: the CLI imports this module.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

from . import jobfiles, layout

FILE = "metrics.json"
# the phase a job reports (tpuctl/runtime/phases.py writes OUTPUT/phase.json at each change; `tpuctl drill` and the
# run doctor read it): before the first step, the first step (its compile), between steps, a save, an evaluation
PHASE_FILE = "phase.json"
PHASES = ("start", "compile", "step", "save", "eval")
CAP = 300          # points kept per metric: past it, every other point goes (the first and the last stay)
_BARS = "▁▂▃▄▅▆▇█"


def thin(points: list[list[float]], cap: int = CAP) -> list[list[float]]:
    """Halve a history past `cap` points, keeping its first and last points: the whole curve stays, coarser."""
    while len(points) > cap:
        points = points[:-1:2] + [points[-1]]
    return points


class MetricsLog:
    def __init__(self, cap: int = CAP) -> None:
        self.cap = cap
        self.step = 0
        self.metrics: dict[str, float] = {}
        self.history: dict[str, list[list[float]]] = {}
        self.attempts: list[dict[str, float]] = []

    def begin(self, step: int, now: float) -> None:
        """Training (re)starts at `step` (the step its checkpoint restored; 0 on a fresh start)."""
        self.attempts.append({"start": now, "from": float(step), "step": float(step), "last": now,
                              "step_seconds": 0.0, "calls": 0.0, "first_seconds": 0.0, "checkpoint_seconds": 0.0})

    def stepped(self, step: int, seconds: float, now: float) -> None:
        """Steps up to `step` done, `seconds` of them spent inside training steps since the last call."""
        if not self.attempts:
            self.begin(step, now)
        a = self.attempts[-1]
        if not a.get("calls"):
            a["first_seconds"] = seconds
        a["step"], a["last"], a["step_seconds"] = float(step), now, a["step_seconds"] + seconds
        a["calls"] = a.get("calls", 0.0) + 1

    def checkpointed(self, seconds: float, now: float) -> None:
        """A checkpoint save blocked training for `seconds` (outside the steps' own time)."""
        if not self.attempts:
            self.begin(int(self.step), now)
        a = self.attempts[-1]
        a["checkpoint_seconds"] = a.get("checkpoint_seconds", 0.0) + seconds

    def record(self, step: int, values: Mapping[str, Any]) -> None:
        """Values at `step`; a step at or before one already recorded (a resumed run) replaces what followed it."""
        self.step = int(step)
        self.metrics = {k: float(v) for k, v in values.items() if _number(v)}
        for name, value in self.metrics.items():
            points = [p for p in self.history.get(name, []) if p[0] < self.step]
            points.append([self.step, value])
            self.history[name] = thin(points, self.cap)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "metrics": self.metrics, "history": self.history, "attempts": self.attempts}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], cap: int = CAP) -> "MetricsLog":
        """The file as the job wrote it, which is not trusted: points whose step or value is not a finite number
        are dropped, and a history longer than the cap (a job writing its own file) is thinned as it is read."""
        log = cls(cap)
        step = doc.get("step", 0)
        log.step = int(float(step)) if _number(step) else 0
        log.metrics = {str(k): float(v) for k, v in _mapping(doc.get("metrics")).items() if _number(v)}
        log.history = {str(k): thin([[float(p[0]), float(p[1])] for p in pts if _point(p)], cap)
                       for k, pts in _mapping(doc.get("history")).items() if isinstance(pts, list)}
        attempts = doc.get("attempts", [])
        log.attempts = [{str(k): float(v) for k, v in a.items() if _number(v)}
                        for a in (attempts if isinstance(attempts, list) else []) if isinstance(a, dict)]
        log.attempts = [a for a in log.attempts if all(k in a for k in ("start", "from", "step", "last",
                                                                          "step_seconds"))]   # goodput reads these
        return log


def _mapping(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, dict) else {}


def _point(p: Any) -> bool:
    return isinstance(p, (list, tuple)) and len(p) == 2 and _number(p[0]) and _number(p[1])


def _number(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError, OverflowError):   # float() of a 400-digit int overflows
        return False


def parse(raw: bytes | None) -> MetricsLog | None:
    """A metrics file as read from the store; None when absent or unreadable (a job's file is not trusted)."""
    try:
        return parse_or_why(raw)
    except jobfiles.Unreadable:
        return None


def parse_or_why(raw: bytes | None) -> MetricsLog | None:
    """parse(), with jobfiles.Unreadable saying what is wrong with the file."""
    if not raw:
        return None
    doc = jobfiles.loads(raw)
    if not isinstance(doc, dict):
        raise jobfiles.Unreadable("not a JSON object")
    return MetricsLog.from_json(doc)


def load(store: Any, key: str) -> tuple[MetricsLog | None, str]:
    """The run's metrics file read no further than jobfiles' cap, and what is wrong with it ("" when nothing)."""
    try:
        return parse_or_why(jobfiles.read(store, key)), ""
    except jobfiles.Unreadable as e:
        said = str(e)
        return None, said if said.startswith(FILE) else f"{FILE} is unreadable: {said}"


def phase_doc(store: Any, run_id: str) -> dict[str, Any]:
    """The job's phase.json (runtime/phases.py) as the store holds it, read as every job-written file is (jobfiles'
    cap): {} when absent or unreadable (too large, a link out of the store, no JSON object, caught mid-write on a
    store without atomic writes)."""
    try:
        return jobfiles.read_object(store, f"{layout.run_output(run_id)}/{PHASE_FILE}") or {}
    except jobfiles.Unreadable:
        return {}


def sparkline(values: list[float], width: int = 16) -> str:
    """The curve in `width` block characters (each the mean of its share of the points)."""
    if not values:
        return ""
    if len(values) > width:
        buckets = [values[i * len(values) // width:(i + 1) * len(values) // width] for i in range(width)]
        values = [sum(b) / len(b) for b in buckets if b]
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    return "".join(_BARS[min(len(_BARS) - 1, int((v - lo) / span * len(_BARS)))] for v in values)
