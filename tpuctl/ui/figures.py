"""Figures that cost a cloud call (a cluster's `status`, `ls`'s inventory, and every read of a bucket: a run's
records), asked in background threads so that a page never waits on a cloud: a page shows the last answer with its
age, or that the question is pending, or that no answer came within the deadline. `status` and `ls` are asked
again once older than TPUCTL_UI_REFRESH_SECONDS (30 s) and a page wants them; a store's records at each page's
asking, which waits up to TPUCTL_UI_STORE_WAIT (0.5 s) for the answer before it shows the last one. A call past
TPUCTL_UI_CLOUD_DEADLINE (20 s) is reported as late (Python cannot stop a thread; its answer, if it ever comes, is
still taken)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core import knobs


def refresh_seconds() -> float:
    return knobs.number("TPUCTL_UI_REFRESH_SECONDS", 30)


def deadline_seconds() -> float:
    return knobs.number("TPUCTL_UI_CLOUD_DEADLINE", 20)


def store_wait() -> float:
    return knobs.number("TPUCTL_UI_STORE_WAIT", 0.5)


@dataclass
class Figure:
    """What a page shows of one background question."""
    value: Any = None
    at: float = 0.0          # when `value` was answered (0: never)
    asked: float = 0.0       # when the question now in flight was asked (0: none in flight)
    error: str = ""          # the last call's error, if it failed
    tried: float = 0.0       # when the last call ended, answered or not
    done: threading.Event = field(default_factory=threading.Event)   # set when the call in flight ends

    def age(self, now: float) -> str:
        """How old the figure is, in words the page shows beside it."""
        if self.asked and now - self.asked > deadline_seconds():
            late = f"no answer in {now - self.asked:.0f}s"
            return f"{late}; shown from {now - self.at:.0f}s ago" if self.at else late
        if not self.at:
            return f"asking ({max(now - self.asked, 0):.0f}s)" if self.asked else "not asked yet"
        return f"{now - self.at:.0f}s old" + (" (asking again)" if self.asked else "")


class Figures:
    """Background answers by key; `get` waits no longer than it is told."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.figures: dict[str, Figure] = {}

    def get(self, key: str, ask: Callable[[], Any], max_age: float | None = None, wait: float = 0.0) -> Figure:
        """The figure as known now; asked again (in the background) when its last answer is older than `max_age`
        (default TPUCTL_UI_REFRESH_SECONDS) and no call is in flight, and waited for up to `wait` seconds."""
        now = time.time()
        with self.lock:
            fig = self.figures.setdefault(key, Figure())
            if not fig.asked and now - fig.tried >= (refresh_seconds() if max_age is None else max_age):
                fig.asked, fig.done = now, threading.Event()
                # a daemon thread of its own: a cloud call that never returns holds neither the pages nor the
                # process's exit (a pool's workers are joined at exit)
                threading.Thread(target=self._ask, args=(fig, ask), daemon=True, name=f"tpuctl-ui-{key}").start()
            done = fig.done
        if wait > 0:
            done.wait(wait)
        with self.lock:
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
            fig.done.set()
