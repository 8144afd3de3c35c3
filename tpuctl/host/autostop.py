"""Autostop, --max-duration and `submit --down`: worker 0 ends its cluster's compute itself (the policy and its
clock are core/lifecycle.py). The record of why is written first (status reads it; the deletion may end this host
before another write), then the teardown the cluster record names: "exit" (the local agent stops), or "gcp" (the
host deletes its TPU, queued resource or VM as its own identity, google_api.py). A deletion Google refused turns
the record into a failure and is tried again TPUCTL_TEARDOWN_RETRY seconds later. On Google Cloud, worker 0 also
reports, once per `up`, whether its identity may delete the compute at all (teardown-check.json)."""
from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from ..core import budget, knobs, layout, notify
from ..core.lifecycle import Clock, Policy
from . import google_api
from .contexts import Seat

STOP_NOTICE_WAIT = 10.0   # seconds the stop's notification may hold the deletion (a receiver that hangs)


class SelfStop:
    def __init__(self, seat: Seat, stop: threading.Event, clock: Clock) -> None:
        """`stop`: the agent's, set to end a local agent ("exit" teardown); `clock`: the cluster's idleness."""
        self.seat, self.stop, self.clock = seat, stop, clock
        self.ending = False                  # this host asked for its own deletion
        self._retry_at = 0.0                 # when a refused self-deletion may be tried again
        self._checked_for: object = None     # the `up` (record's `written`) the teardown check answered
        self.budget = budget.Guard(seat.store, lambda: str(seat.record.get("cluster", "")))

    def enforce(self) -> None:
        """Ends the compute when the cluster's policy says it is time (idle past autostop, past the deadline)."""
        if self.seat.worker != 0 or self.ending:
            return
        reason = self.clock.due(Policy.of(self.seat.record), False) or self.budget.due()
        if reason:
            self.end_compute(reason)

    def run_limit(self) -> str:
        """Why the cluster's own limit ends a running run now ("" while it does not): on worker 0, which enforces
        them, the --max-duration deadline or a spent --budget (halts.py asks)."""
        if self.seat.worker != 0:
            return ""
        if self.clock.due(Policy.of(self.seat.record), running=True):
            return "the cluster's --max-duration deadline has come"
        spent = self.budget.due()
        return f"the cluster's --budget is spent ({spent})" if spent else ""

    def idle_limit(self) -> str:
        """On worker 0, autostop's reason once the cluster has been idle past it ("" before, or without autostop):
        asked only while a run is stalled and its action has run (supervisor.py), which stopped the idle clock."""
        if self.seat.worker != 0:
            return ""
        due = self.clock.due(Policy.of(self.seat.record), running=False)
        return due if due.startswith("autostop") else ""

    def end_compute(self, reason: str) -> None:
        a = self.seat
        if time.monotonic() < self._retry_at:
            return
        how = a.record.get("teardown")
        stopped = {"reason": reason, "time": time.time(), "host": a.host, "worker": a.worker}
        a.store.write(layout.STOPPED, json.dumps(stopped).encode())
        print(f"tpuctl agent: ending the compute: {reason}", file=sys.stderr, flush=True)
        notify.emit(a.store, "cluster.stopped", f"cluster.stopped-{a.record.get('written')}",
                    str(a.record.get("cluster", "")), reason=notify.stop_kind(reason), why=reason)
        notify.flush(STOP_NOTICE_WAIT)   # the deletion ends this host, and with it the sending thread
        if how == "exit":
            self.stop.set()
        elif how == "gcp":
            try:
                google_api.delete_all(google_api.targets(a.record))
            except Exception as e:  # noqa: BLE001 - a refused or unreachable API: say so where status looks
                failed = f"{type(e).__name__}: {e}"
                a.store.write(layout.STOPPED, json.dumps({**stopped, "failed": failed}).encode())
                print(f"tpuctl agent: could not end the compute: {failed}", file=sys.stderr, flush=True)
                self._retry_at = time.monotonic() + knobs.number("TPUCTL_TEARDOWN_RETRY", 60)
                return
            self.ending = True   # the deletion is under way: take no new run while the host still lives

    def check_teardown(self) -> None:
        """Worker 0 of a Google Cloud host reports, for each `up` (the record's `written`), whether its own
        identity holds what deleting the compute needs: `up --autostop` waits for this report, and `status`
        shows autostop as enforced only on its word. testIamPermissions sees project-level grants, the only ones
        that can carry tpu.nodes.delete."""
        a = self.seat
        written = a.record.get("written")
        if a.worker != 0 or a.record.get("teardown") != "gcp" or written == self._checked_for:
            return
        self._checked_for = written
        needed = sorted({t.permission for t in google_api.targets(a.record)})
        report: dict[str, Any] = {"for": written, "host": a.host, "time": time.time(), "needed": needed}
        try:
            report["identity"] = google_api.identity()
            have = google_api.held(str(a.record.get("project", "")), needed)
            report["missing"] = [p for p in needed if p not in have]
        except Exception as e:  # noqa: BLE001 - cannot tell: never report able
            report["missing"], report["error"] = needed, f"{type(e).__name__}: {e}"
            if isinstance(e, google_api.ApiError) and e.disabled:
                report["disabled_api"] = e.disabled   # not a missing grant: an API to enable
        report["able"] = not report["missing"]
        a.store.write(layout.TEARDOWN_CHECK, json.dumps(report).encode())
