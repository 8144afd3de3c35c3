"""The run events worker 0's agent sends (core/notify.py): run.started (run.restarted for a later attempt, on the
host that took the run over), then run.finished or run.failed with the figures that matter (and the failure's
cause). run.stalled is the doctor's, sent by whichever host saw the stall (doctor.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..core import budget, goodput, layout, metrics, notify, runs
from ..core.store import BlobStore

TAIL_LINES = 10


@dataclass(frozen=True)
class RunEvents:
    """One attempt's events, as the attempt (attempt.py) describes it."""
    store: BlobStore
    cluster: str        # the cluster record's name for it
    run_id: str
    attempt: int
    worker: int         # only worker 0's agent sends them
    host: str
    started_at: float   # when this attempt started (time.time())

    def started(self, restart: int = 0, round_: int = 1, exit_code: int | None = None) -> None:
        """`restart`: how many times `submit --max-restarts` has started the job again; `round_`: the round of a run
        across many hosts (rounds.py), which every host started anew; `exit_code`: what the job exited with before
        this restart on this host (the run page lists restarts with it)."""
        if self.worker != 0:
            return
        if self.attempt > 1 or restart or round_ > 1:
            key = f"run.restarted-{self.run_id}-a{self.attempt}" + (f"-r{restart}" if restart else "") \
                + (f"-n{round_}" if round_ > 1 else "")
            notify.emit(self.store, "run.restarted", key, self.cluster, self.run_id, attempt=self.attempt,
                        restart=restart, host=self.host, **({"round": round_} if round_ > 1 else {}),
                        **({"exit_code": exit_code} if restart and exit_code is not None else {}))
        else:
            notify.emit(self.store, "run.started", f"run.started-{self.run_id}", self.cluster, self.run_id,
                        host=self.host)

    def ended(self, rc: int, cancelled: bool, failure: str = "") -> None:
        """A cancelled run sends nothing of its own (a cancel is the user's; a stop says cluster.stopped).
        `failure`: the cause of a failed or stalled run (failures.py), which run.failed carries."""
        if self.worker != 0 or cancelled:
            return
        store, now = self.store, time.time()
        if rc != 0 or failure:
            notify.emit(store, "run.failed", f"run.ended-{self.run_id}", self.cluster, self.run_id, exit_code=rc,
                        log_tail=self._tail(), **({"failure": failure} if failure else {}))
            return
        first = self.started_at
        m = metrics.parse(store.read(layout.run_metrics(self.run_id)))
        fields: dict[str, Any] = {"exit_code": 0}
        if m and m.attempts:
            first = min(first, m.attempts[0]["start"])
            stalls = [float(d["since"]) for d in runs.stalls(store, self.run_id) if d.get("since")]
            fields["goodput_pct"] = goodput.breakdown(m.attempts, first, now, stalls)["goodput_pct"]
        fields["duration_s"] = round(now - first, 1)
        hourly = float(budget.read(store).get("hourly") or 0)
        if hourly:
            fields["cost_usd"] = round((now - first) / 3600 * hourly, 2)
        if m and "loss" in m.metrics:
            fields["loss"] = m.metrics["loss"]
        notify.emit(store, "run.finished", f"run.ended-{self.run_id}", self.cluster, self.run_id, **fields)

    def _tail(self) -> str:
        """The last lines of worker 0's log, as shipped (logshipper.py flushed it when the job's output ended)."""
        try:
            keys = [k for k, _ in self.store.list(layout.run_logs(self.run_id, 0))][-2:]
            text = b"".join(self.store.read(k) or b"" for k in keys).decode(errors="replace")
            return "\n".join(text.rstrip("\n").splitlines()[-TAIL_LINES:])
        except Exception:  # noqa: BLE001 - the tail is a nicety: without it the event still goes
            return ""
