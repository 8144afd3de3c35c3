"""The run events worker 0's agent sends (core/notify.py): run.started (run.restarted for a later attempt, on the
host that took the run over), then run.finished or run.failed with the figures that matter."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..core import budget, goodput, layout, metrics, notify

if TYPE_CHECKING:
    from .attempt import Attempt

TAIL_LINES = 10


def started(at: Attempt, restart: int = 0, round_: int = 1) -> None:
    """`restart`: how many times `submit --max-restarts` has started the job again; `round_`: the round of a run
    across many hosts (rounds.py), which every host started anew."""
    if at.a.worker != 0:
        return
    if at.attempt > 1 or restart or round_ > 1:
        key = f"run.restarted-{at.run_id}-a{at.attempt}" + (f"-r{restart}" if restart else "") \
            + (f"-n{round_}" if round_ > 1 else "")
        notify.emit(at.a.store, "run.restarted", key, _cluster(at), at.run_id, attempt=at.attempt, restart=restart,
                    host=at.a.host, **({"round": round_} if round_ > 1 else {}))
    else:
        notify.emit(at.a.store, "run.started", f"run.started-{at.run_id}", _cluster(at), at.run_id, host=at.a.host)


def ended(at: Attempt, rc: int, cancelled: bool) -> None:
    """A cancelled run sends nothing of its own (a cancel is the user's; a stop says cluster.stopped)."""
    if at.a.worker != 0 or cancelled:
        return
    store, now = at.a.store, time.time()
    if rc != 0:
        notify.emit(store, "run.failed", f"run.ended-{at.run_id}", _cluster(at), at.run_id, exit_code=rc,
                    log_tail=_tail(at))
        return
    first = at.started
    m = metrics.parse(store.read(layout.run_metrics(at.run_id)))
    fields: dict[str, Any] = {"exit_code": 0}
    if m and m.attempts:
        first = min(first, m.attempts[0]["start"])
        fields["goodput_pct"] = goodput.breakdown(m.attempts, first, now)["goodput_pct"]
    fields["duration_s"] = round(now - first, 1)
    hourly = float(budget.read(store).get("hourly") or 0)
    if hourly:
        fields["cost_usd"] = round((now - first) / 3600 * hourly, 2)
    if m and "loss" in m.metrics:
        fields["loss"] = m.metrics["loss"]
    notify.emit(store, "run.finished", f"run.ended-{at.run_id}", _cluster(at), at.run_id, **fields)


def _cluster(at: Attempt) -> str:
    return str(at.a.record.get("cluster", ""))


def _tail(at: Attempt) -> str:
    """The last lines of worker 0's log, as shipped (logshipper.py flushed it when the job's output ended)."""
    try:
        keys = [k for k, _ in at.a.store.list(layout.run_logs(at.run_id, 0))][-2:]
        text = b"".join(at.a.store.read(k) or b"" for k in keys).decode(errors="replace")
        return "\n".join(text.rstrip("\n").splitlines()[-TAIL_LINES:])
    except Exception:  # noqa: BLE001 - the tail is a nicety: without it the event still goes
        return ""
