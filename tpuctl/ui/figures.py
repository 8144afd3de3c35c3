"""Figures that cost a cloud call (a cluster's `status`, `ls`'s inventory), asked in background threads so that a
page never waits on a cloud: a page shows the last answer with its age, or that the question is pending, or that
no answer came within the deadline. Each figure is asked again once it is older than TPUCTL_UI_REFRESH_SECONDS
(30 s) and a page wants it; a call past TPUCTL_UI_CLOUD_DEADLINE (20 s) is reported as late (Python cannot stop a
thread; its answer, if it ever comes, is still taken)."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable


def refresh_seconds() -> float:
    return float(os.environ.get("TPUCTL_UI_REFRESH_SECONDS", "30"))


def deadline_seconds() -> float:
    return float(os.environ.get("TPUCTL_UI_CLOUD_DEADLINE", "20"))


@dataclass
class Figure:
    """What a page shows of one background question."""
    value: Any = None
    at: float = 0.0          # when `value` was answered (0: never)
    asked: float = 0.0       # when the question now in flight was asked (0: none in flight)
    error: str = ""          # the last call's error, if it failed
    tried: float = 0.0       # when the last call ended, answered or not

    def age(self, now: float) -> str:
        """How old the figure is, in words the page shows beside it."""
        if self.asked and now - self.asked > deadline_seconds():
            late = f"no answer in {now - self.asked:.0f}s"
            return f"{late}; shown from {now - self.at:.0f}s ago" if self.at else late
        if not self.at:
            return f"asking ({max(now - self.asked, 0):.0f}s)" if self.asked else "not asked yet"
        return f"{now - self.at:.0f}s old" + (" (asking again)" if self.asked else "")


class Figures:
    """Background answers by key; `get` never blocks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.figures: dict[str, Figure] = {}

    def get(self, key: str, ask: Callable[[], Any]) -> Figure:
        now = time.time()
        with self.lock:
            fig = self.figures.setdefault(key, Figure())
            if not fig.asked and now - fig.tried >= refresh_seconds():
                fig.asked = now
                # a daemon thread of its own: a cloud call that never returns holds neither the pages nor the
                # process's exit (a pool's workers are joined at exit)
                threading.Thread(target=self._ask, args=(fig, ask), daemon=True, name=f"tpuctl-ui-{key}").start()
            return Figure(fig.value, fig.at, fig.asked, fig.error, fig.tried)

    def _ask(self, fig: Figure, ask: Callable[[], Any]) -> None:
        try:
            value, error = ask(), ""
        except Exception as e:  # noqa: BLE001 - a cloud that refuses: the page says so beside the figure
            value, error = None, getattr(e, "message", "") or f"{type(e).__name__}: {e}"
        with self.lock:
            if not error:
                fig.value, fig.at = value, time.time()
            fig.error, fig.tried, fig.asked = error, time.time(), 0.0
