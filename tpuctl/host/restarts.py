"""What a run becomes when its job process ends: xpk's restart contract (`submit --max-restarts N`).

xpk runs a workload as a JobSet whose pod failure policy fails the job at once on any exit code except 42 and
127-255, and whose JobSet `maxRestarts` (xpk `--max-restarts`, default "0") restarts it otherwise
(AI-Hypercomputer/xpk src/xpk/commands/workload.py `get_restart_exit_codes`: `[42] + range(127, 256)`;
src/xpk/parser/workload.py `--max-restarts`, default '0'). tpuctl keeps that contract: a job asks for a restart by
exiting `tpuctl.runtime.RESTART_CODE` (42), and one killed by a signal (exit 128+n: 143 for SIGTERM, 137 for
SIGKILL) is restarted too, unless tpuctl itself sent the signal (a cancel, the --max-duration deadline, the agent
stopping with its host): then the job did not fail, and the run goes on as tpuctl's own stop decides.

`decide` is pure, and the agent calls it from one place (attempt.py), so the rule can be read, tested and
re-wired alone; so are `backoff`, the wait before a restart, and `wait_out`, which a cancel interrupts.
"""
from __future__ import annotations

import threading
import time
from enum import Enum
from typing import Callable

from ..core import knobs, runs
from ..runtime import RESTART_CODE


class Decision(str, Enum):
    DONE = "done"          # exit 0: the run succeeded
    RESTART = "restart"    # run the job again on this host, same run and output directory (its checkpoint)
    FAIL = "fail"          # the run failed: any other exit, or a restart past --max-restarts
    RESUME = "resume"      # tpuctl ended the job itself: not the job's failure, and no restart is counted


def restartable(exit_code: int) -> bool:
    """The exit codes xpk restarts: 42, and 127-255 (a shell's 'cannot run' and 128+n, killed by signal n)."""
    return exit_code == RESTART_CODE or 127 <= exit_code <= 255


def decide(exit_code: int, sent_by_tpuctl: bool, restarts_used: int, max_restarts: int) -> Decision:
    """What the run becomes after its job process ended with `exit_code`. `sent_by_tpuctl`: tpuctl signalled the
    job (cancel, deadline, the agent's own stop) before it ended; `restarts_used` of `max_restarts` are spent."""
    if sent_by_tpuctl:
        return Decision.RESUME
    if exit_code == 0:
        return Decision.DONE
    if restartable(exit_code) and restarts_used < max_restarts:
        return Decision.RESTART
    return Decision.FAIL


def backoff(previous: float, ran: float) -> float:
    """Seconds to wait before the next restart, after a job that ran `ran` seconds and a wait of `previous` before
    it (0 for the first restart): TPUCTL_RESTART_BACKOFF (1 s) doubled for every restart in a row, capped at
    TPUCTL_RESTART_BACKOFF_MAX (60 s), and back to the first step once a job ran TPUCTL_RESTART_HEALTHY seconds
    (600) before it exited. Without it a job that exits 42 at once under a large --max-restarts restarted about 34
    times a second (issue 38.1); with it, fewer than 20 restarts in its first ten minutes. Kubernetes backs a
    crashing container off the same way (10 s doubled, capped at five minutes, reset after ten minutes of running:
    kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#restart-policy)."""
    first = knobs.number("TPUCTL_RESTART_BACKOFF", 1)
    cap = knobs.number("TPUCTL_RESTART_BACKOFF_MAX", 60)
    if not previous or ran >= knobs.number("TPUCTL_RESTART_HEALTHY", 600):
        return min(first, cap)
    return min(previous * 2, cap)


def wait_out(seconds: float, stop: threading.Event, why_not: Callable[[], str], beat: Callable[[float], object]) -> str:
    """The wait before a restart: "" once it is over, or why the run ends instead: the agent's stop, or
    `why_not()` (a cancel, the cluster's limit), checked every TPUCTL_CANCEL_POLL seconds (1) so a cancel wins
    during the wait too; `beat(seconds left)` keeps the run's heartbeat."""
    end, every = time.monotonic() + seconds, knobs.number("TPUCTL_CANCEL_POLL", 1)
    last = 0.0
    while (left := end - time.monotonic()) > 0:
        if time.monotonic() - last >= runs.heartbeat_seconds():
            last = time.monotonic()
            beat(left)
        if stop.wait(min(left, every)):
            return "the agent is stopping"
        if why := why_not():
            return why
    return ""
