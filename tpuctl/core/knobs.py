"""The tuning knobs: TPUCTL_* environment variables that set a wait, a poll, a retry or a size. Every one is read
here (`number`, `count`), checked where it is read, and refused with one clear error naming it.

Why: each was read as `float(os.environ.get(...))`. `TPUCTL_RESTART_BACKOFF=abc` raised a bare ValueError inside
the agent's attempt, which left the run `running` for good (`cancel` and `up` did not end it, `submit` followed it
forever), and `nan` or a negative value removed the wait altogether (`time.sleep(nan)` and `Event.wait(-1)` return
at once): issue 52.7. Now a value that is not a finite number within its knob's bounds is a `TpuctlError`
(INPUT): the CLI prints it as any bad input, and the agent checks them all before it starts a run's job
(`check`), so a bad knob ends the run with the message in its log rather than hanging it.

KNOBS holds each knob's bounds (not its default, which stays beside the code that uses it); reading one not
listed is a programming error (KeyError), so a new knob cannot skip the check. What tpuctl itself sets for a
job (TPUCTL_NUM_WORKERS, TPUCTL_SESSION_DEADLINE: runtime/) is no knob.
"""
from __future__ import annotations

import math
import os
from typing import Mapping, NamedTuple

from .errors import TpuctlError, bad_input

_FOREVER = 10 * 365 * 86400.0   # a bound past any real wait, below what Event.wait accepts (OverflowError past it)


class Bounds(NamedTuple):
    low: float
    high: float = _FOREVER
    whole: bool = False      # a count of bytes or entries: an integer
    above: bool = False      # strictly above `low` (a poll of 0 spins)
    unit: str = "seconds"

    def says(self) -> str:
        kind = "a whole number" if self.whole else f"a number of {self.unit}"
        low = f"above {self.low:g}" if self.above else f"at least {self.low:g}"
        high = f"{int(self.high)}" if self.whole else f"{self.high:g}"
        return f"{kind} {low}" + (f" and at most {high}" if self.high < _FOREVER else "")


_WAIT = Bounds(0.0)                 # a wait or a deadline: 0 means none
_POLL = Bounds(0.0, 86400.0, above=True)   # how often something is looked at: never 0 (a busy loop)
_BYTES = Bounds(0, 1 << 62, whole=True)

KNOBS: dict[str, Bounds] = {
    # the agent and its runs (host/)
    "TPUCTL_RESTART_BACKOFF": _WAIT, "TPUCTL_RESTART_BACKOFF_MAX": _WAIT, "TPUCTL_RESTART_HEALTHY": _WAIT,
    "TPUCTL_CANCEL_POLL": _POLL, "TPUCTL_CANCEL_GRACE": _WAIT, "TPUCTL_DRAIN_SECONDS": _WAIT,
    "TPUCTL_STOP_GRACE": _WAIT, "TPUCTL_STALE_SECONDS": _POLL, "TPUCTL_PEER_LOST_SECONDS": _POLL,
    "TPUCTL_LOG_FLUSH_SECONDS": _POLL, "TPUCTL_LOG_HOLD_BYTES": _BYTES, "TPUCTL_LOG_HOLD_WAIT": _WAIT,
    "TPUCTL_LOG_POLL_MAX": _POLL, "TPUCTL_STORE_FLOOR_BYTES": _BYTES, "TPUCTL_TPU_ADDRESS_WAIT": _WAIT,
    "TPUCTL_STORE_WAIT_MAX": _POLL, "TPUCTL_TEARDOWN_RETRY": _POLL, "TPUCTL_RUNTIME_WAIT": _WAIT,
    "TPUCTL_MAX_PACKAGE_BYTES": Bounds(1, 1 << 62, whole=True), "TPUCTL_MAX_PACKAGE_ENTRIES": Bounds(1, 1 << 62,
                                                                                                    whole=True),
    "TPUCTL_LEASE_SECONDS": _POLL, "TPUCTL_LOCK_WAIT": _WAIT, "TPUCTL_BUDGET_CHECK": _POLL,
    "TPUCTL_WORKER": Bounds(0, 1 << 20, whole=True),
    "TPUCTL_NOTIFY_TIMEOUT": _POLL, "TPUCTL_NOTIFY_RETRY_FOR": _WAIT, "TPUCTL_NOTIFY_BACKOFF": _POLL,
    "TPUCTL_NOTIFY_EXIT_WAIT": _WAIT, "TPUCTL_NOTIFY_IDLE": _WAIT, "TPUCTL_APPRISE_INSTALL_WAIT": _POLL,
    "TPUCTL_PROGRESS_SECONDS": _POLL,   # read by the job itself (runtime/metrics_file.py), from the agent's environment
    "TPUCTL_TPU_METRICS_SECONDS": _WAIT,   # 0: no chip sampling (host/chipsampler.py)
    # the run doctor (host/stall.py): the default stall window (15 min) and how often progress is looked at
    "TPUCTL_STALL_SECONDS": _POLL, "TPUCTL_STALL_POLL": _POLL, "TPUCTL_STACKS_WAIT": _WAIT,
    "TPUCTL_NOTIFY_THREADS": Bounds(1, 1024, whole=True),   # notification senders at most (core/delivery.py)
    "TPUCTL_NVIDIA_SMI_DEADLINE": _POLL,   # how long one nvidia-smi may take (core/nvidiasmi.py)
    # the CLI and the watcher (control/, cli/, providers/)
    "TPUCTL_POLL_INTERVAL": _POLL, "TPUCTL_RETRY_BASE": _WAIT, "TPUCTL_TEARDOWN_WAIT": _WAIT,
    "TPUCTL_WATCH_POLL": _POLL, "TPUCTL_RECOVER_BACKOFF": _WAIT, "TPUCTL_REPLACE_WAIT": _WAIT, "TPUCTL_LEASE_WAIT": _WAIT,
    "TPUCTL_WATCHER_WAIT": _WAIT, "TPUCTL_REVIVE_SECONDS": _WAIT, "TPUCTL_TB_SYNC_SECONDS": _POLL,
    "TPUCTL_STOP_WAIT": _WAIT, "TPUCTL_HASH_PROGRESS_BYTES": Bounds(1, 1 << 62, whole=True),
    "TPUCTL_PACKAGE_WARN_BYTES": _BYTES, "TPUCTL_NOTEBOOK_SESSION_SECONDS": _POLL,
    "TPUCTL_FORBIDDEN_GRACE": _WAIT, "TPUCTL_GKE_DEADLINE": _WAIT, "TPUCTL_GKE_POLL_SECONDS": _WAIT,
    "TPUCTL_GKE_CANCEL_GRACE": _WAIT, "TPUCTL_GKE_JOBSET_READY_SECONDS": _WAIT, "TPUCTL_KAGGLE_INPUT_WAIT": _WAIT, "TPUCTL_KAGGLE_DATASET_WAIT": _WAIT,
    "TPUCTL_GKE_HOLD_DAYS": Bounds(0.0, 30.0, above=True, unit="days"),   # providers/gke/maintenance.py
    "TPUCTL_GKE_STUCK_SECONDS": _WAIT,   # providers/gke/jobset_status.py stuck_words
    "TPUCTL_KAGGLE_POLL": _POLL, "TPUCTL_KAGGLE_STREAM_RETRY": _POLL, "TPUCTL_KAGGLE_SESSION_SECONDS": _POLL,
    "TPUCTL_KAGGLE_GRACE_SECONDS": _WAIT,
    # the page (`tpuctl ui`: ui/)
    "TPUCTL_UI_REFRESH_SECONDS": _POLL, "TPUCTL_UI_CLOUD_DEADLINE": _POLL, "TPUCTL_UI_STORE_WAIT": _WAIT,
    "TPUCTL_UI_POLL_SECONDS": _POLL, "TPUCTL_UI_LOG_TAIL_BYTES": Bounds(1, 1 << 40, whole=True),
    "TPUCTL_UI_PAGE": Bounds(1, 100000, whole=True),
    "TPUCTL_RUN_FILE_MAX_BYTES": Bounds(1024, 1 << 32, whole=True),   # a run file read at most (jobfiles.py)
    "TPUCTL_METRICS_KEEP": Bounds(1, 100000, whole=True),   # finished runs /metrics exports per cluster (ui/metrics.py)
    # a price, in dollars an hour (core/budget.py): 0 would make every cost free
    "TPUCTL_PRICE_PER_HOUR": Bounds(0.0, 1e9, above=True, unit="dollars an hour"),
    # warm restarts (host/compilecache.py): the bound on a job's JAX compilation cache, on the host and in the store
    "TPUCTL_COMPILE_CACHE_BYTES": Bounds(1, 1 << 62, whole=True),
    "TPUCTL_DRILL_POLL": _POLL, "TPUCTL_DRILL_WAIT": _WAIT, "TPUCTL_DRILL_PID_WAIT": _WAIT,   # `tpuctl drill` (control/drill.py)
}


def _parse(name: str, raw: str) -> float:
    b = KNOBS[name]
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    ok = math.isfinite(value) and (value > b.low if b.above else value >= b.low) and value <= b.high \
        and (not b.whole or value == int(value))
    if not ok:
        raise bad_input(f"{name}={raw!r} is not {b.says()}",
                        f"unset {name} to use its default, or set it to {b.says()}")
    return value


def number(name: str, default: float) -> float:
    """The knob `name` (a wait, a poll, a price) or `default` when it is unset or empty."""
    raw = os.environ.get(name, "") if KNOBS[name] else ""
    return _parse(name, raw) if raw.strip() else float(default)


def count(name: str, default: int) -> int:
    """The whole-number knob `name` (bytes, entries) or `default` when it is unset or empty."""
    raw = os.environ.get(name, "") if KNOBS[name] else ""
    return int(_parse(name, raw)) if raw.strip() else int(default)


def problems(environ: Mapping[str, str] | None = None) -> list[TpuctlError]:
    """The knobs set in `environ` (this process's) that would be refused where they are read."""
    out = []
    env = os.environ if environ is None else environ
    for name in KNOBS:
        if env.get(name, "").strip():
            try:
                _parse(name, env[name])
            except TpuctlError as e:
                out.append(e)
    return out


def check(environ: Mapping[str, str] | None = None) -> None:
    """Refuse the first bad knob of `environ`: before anything waits on one (the agent, before a run's job
    starts; the CLI, before a command runs)."""
    bad = problems(environ)
    if bad:
        raise bad[0]
