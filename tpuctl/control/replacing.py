"""A sick host's replacement that does not come (issue 60 item 4): the watcher deleted the host's compute
(control/watch.py `_replace`) and re-creates it as it does a lost host's, but not without end: a replacement
that has not succeeded within TPUCTL_REPLACE_WAIT seconds (1 hour: of the host being marked sick while its
delete is refused; of the re-create's start while every zone is out of capacity) ends the cluster's unfinished runs `ended`, with failure
`replacement-failed` and the reason in their status note (what `jobs` shows), and ends the watch: the run's host is
gone and nothing would bring its run back. A preempted host has no such bound (`up --recover-for` bounds it)."""
from __future__ import annotations

import time

from ..core import knobs, notify
from ..core.store import BlobStore
from . import armed
from .down import end_runs

SICK = "a host was marked sick"   # how watch.py's `_sick` begins the reason a sick host's replacement carries
FAILURE = "replacement-failed"    # the runs' `failure` (jobs --json)


def wait_seconds() -> float:
    return knobs.number("TPUCTL_REPLACE_WAIT", 3600)


def is_replacement(lost: str) -> bool:
    return lost.startswith(SICK)


def overdue(since: float, now: float | None = None) -> bool:
    """Whether a replacement begun at `since` (time.time()) has run past its bound."""
    return (now or time.time()) - since > wait_seconds()


def give_up(store: BlobStore, cluster: str, lost: str, error: str) -> str:
    """The runs ended and the watch ended, the reason notified; returns the reason."""
    why = (f"the sick host's replacement failed: {error} (for {wait_seconds():.0f}s, TPUCTL_REPLACE_WAIT; {lost})")
    ended = end_runs(store, why, failure=FAILURE)
    armed.end(store, why)
    notify.emit(store, "cluster.recovery_given_up", f"cluster.recovery_given_up-replace-{int(time.time())}",
                cluster, why=why, runs=ended)
    return why
