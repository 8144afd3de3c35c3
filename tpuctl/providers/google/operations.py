"""Blocking waits with deadlines, and retries of transient failures with capped exponential backoff + jitter.

Both take injectable `clock`/`sleep` so tests drive them without real time.
TPUCTL_POLL_INTERVAL caps the poll interval (seconds, default 2); TPUCTL_RETRY_BASE sets the first retry delay
(default 1 s). Tests shrink both.
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable

from ...core import knobs
from ...core.errors import ErrorKind, TpuctlError
from .errors import classify


def poll_cap() -> float:
    return knobs.number("TPUCTL_POLL_INTERVAL", 2)


def wait(poll: Callable[[], tuple[bool, str]], what: str, deadline_s: float,
         progress: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> str:
    """Call poll() until it reports done; report each new state; raise timeout past the deadline."""
    cap = poll_cap()
    interval = min(0.25, cap)
    end = clock() + deadline_s
    last = None
    while True:
        done, state = poll()
        if state != last and progress:
            progress(state)
        last = state
        if done:
            return state
        if clock() >= end:
            raise TpuctlError(ErrorKind.TIMEOUT, f"{what} still {state} after {deadline_s:.0f}s",
                              "check the Cloud console; run the same command again to keep waiting")
        sleep(min(interval, max(0.0, end - clock())))
        interval = min(interval * 1.5, cap)


def call(fn: Callable[..., Any], *args: Any, what: str = "request", attempts: int = 6,
         sleep: Callable[[float], None] = time.sleep, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), retrying transient errors; any other error is classified and raised."""
    base = knobs.number("TPUCTL_RETRY_BASE", 1)
    for attempt in range(attempts):
        try:
            return fn(*args, **kwargs)
        except TpuctlError:
            raise
        except Exception as e:  # noqa: BLE001 - google clients raise many types; classify() sorts them
            err = classify(e, what)
            if not err.retryable or attempt == attempts - 1:
                raise err from e
            sleep(min(base * 2 ** attempt, 30.0) * random.uniform(0.5, 1.0))


def get_or_none(fn: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
    """call(), with None for a resource that does not exist (NOT_FOUND) instead of an error."""
    try:
        return call(fn, *args, what=what, **kwargs)
    except TpuctlError as e:
        if e.kind is ErrorKind.NOT_FOUND:
            return None
        raise
