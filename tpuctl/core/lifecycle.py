"""When a cluster's compute ends by itself, enforced by the agent on the host so that a closed laptop still stops
the billing: autostop (no run active for a while), a hard deadline (`up --max-duration`), and `submit --down` (the
run reached its final state). The CLI and the agent share this module; no TensorFlow, no google imports.

The agent that fires writes `tpuctl/stopped.json` (why and when) before it tears down, so `status` and `ls` can
say "autostopped at ..." afterwards; `up` brings the cluster back and the record then predates it.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from .errors import bad_input

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, flag: str) -> int:
    """`90s`, `30m`, `2h`, `1d` as seconds; `off` (or 0) as 0."""
    t = text.strip().lower()
    if t in ("off", "0", "none"):
        return 0
    m = _DURATION.match(t)
    if not m or int(m.group(1)) == 0:
        raise bad_input(f"{flag} {text!r} is not a duration", f"use 90s, 30m, 2h or 1d, or {flag} off")
    return int(m.group(1)) * _UNIT[m.group(2)]


def show_duration(seconds: int) -> str:
    """In the largest unit that is exact (90s, 30m, 2h, 1d); past an hour, hours and minutes (8h45m, not 525m)."""
    for unit, size in (("d", 86400), ("h", 3600)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m" if seconds % 60 == 0 and seconds >= 60 else f"{seconds}s"


@dataclass
class Policy:
    """What the cluster record asks of worker 0's agent."""
    autostop: int = 0       # seconds without an active run; 0: off
    deadline: float = 0.0   # epoch seconds; 0: none

    @classmethod
    def of(cls, record: dict[str, Any]) -> "Policy":
        return cls(int(record.get("autostop") or 0), float(record.get("deadline") or 0.0))


class Clock:
    """The agent's view: when the last run ended (or the agent started), and what is due now."""

    def __init__(self, now: float | None = None) -> None:
        self.idle_since = now if now is not None else time.time()

    def busy(self, now: float | None = None) -> None:
        """A run is active (called while one runs and when it ends): idleness counts from the last call."""
        self.idle_since = now if now is not None else time.time()

    def autostop_at(self, policy: Policy) -> float:
        return self.idle_since + policy.autostop if policy.autostop else 0.0

    def due(self, policy: Policy, running: bool, now: float | None = None) -> str:
        """Why the compute must end now, or ""."""
        now = now if now is not None else time.time()
        if policy.deadline and now >= policy.deadline:
            return f"max-duration deadline {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(policy.deadline))}"
        if policy.autostop and not running and now >= self.idle_since + policy.autostop:
            return f"autostop: no run for {show_duration(policy.autostop)}"
        return ""
