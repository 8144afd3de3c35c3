"""What ends a run from outside its job (attempt.py, supervisor.py): a user's `cancel`, the cluster's own limits
(worker 0 enforces --max-duration and --budget), and the agent's stop. Asked before every start and restart,
during the wait before a restart (restarts.wait_out), while the job runs, and while a run across hosts waits for
the others (rounds.py)."""
from __future__ import annotations

import json
import threading
from typing import Callable

from ..core import layout, metrics
from ..core.store import BlobStore
from .contexts import Failed


class Halts:
    def __init__(self, store: BlobStore, run_id: str, stop: threading.Event, failed: Failed,
                 limit: Callable[[], str], first: bool = True) -> None:
        """`stop`: the agent's; `limit`: why the cluster's own limit ends a running run now, "" while it does not
        (autostop.py's run_limit); `first`: the run's first host (slice 0's worker 0), whose job writes the
        checkpoints and phase.json, and so the one that answers a drill (drilled)."""
        self.store, self.run_id, self.stop, self.failed, self._limit = store, run_id, stop, failed, limit
        self.first = first
        self.limit = ""   # the cluster's limit that ended the run (deadline()): its final status says it

    def cancel_asked(self) -> bool:
        try:
            return self.store.read(layout.run_cancel(self.run_id)) is not None
        except Exception as e:  # noqa: BLE001 - a store outage: the next check sees the cancel
            self.failed(e, f"run {self.run_id}'s cancel check")
            return False

    def drill(self, start: int) -> dict[str, object] | None:
        """`tpuctl drill -c`'s request for the job's start `start` (layout.run_drill), once per start; None without
        one or when the store cannot say (the next check reads it)."""
        try:
            raw = self.store.read(layout.run_drill(self.run_id, start))
            if raw is None or self.store.read(layout.run_drill_done(self.run_id, start)) is not None:
                return None
            doc = json.loads(raw)
            return doc if isinstance(doc, dict) else None
        except Exception as e:  # noqa: BLE001 - a store outage or a torn write: the next check reads it
            self.failed(e, f"run {self.run_id}'s drill check")
            return None

    def job_doc(self) -> dict[str, object]:
        """The job's phase.json (runtime/phases.py) as it is now; {} when it reports none or the store cannot say."""
        try:
            return metrics.phase_doc(self.store, self.run_id)
        except Exception:  # noqa: BLE001 - a store outage: a hint for the drill's report only
            return {}

    def job_phase(self) -> str:
        """The phase the job last reported (runtime/phases.py), "" when it reports none or the store cannot say."""
        return str(self.job_doc().get("phase") or "")

    def drilled(self, start: int, doc: dict[str, object]) -> None:
        """The answer to a drill's request: the first host's alone (across hosts every job is signalled, but its
        job is the one that saves, and the drill measures its end)."""
        if not self.first:
            return
        try:
            self.store.write(layout.run_drill_done(self.run_id, start), json.dumps(doc).encode())
        except Exception as e:  # noqa: BLE001 - the drill waits for it and says so; the run goes on
            self.failed(e, f"run {self.run_id}'s drill answer")

    def deadline(self) -> str:
        """Why the cluster's own limit ends the run now ("" while it does not); the compute ends next (the agent's
        enforce, next tick)."""
        return self._limit()

    def halted(self) -> bool:
        """While this host waits for the others (rounds.py): its agent stopping, a cancel, or the cluster's limit
        (a run waiting for a host that never comes back must not keep the compute past it)."""
        self.limit = self.limit or self.deadline()
        return self.stop.is_set() or bool(self.limit) or self.cancel_asked()

    def why_not_restart(self) -> str:
        if self.cancel_asked():
            return "cancelled while waiting to restart: the job is not started again"
        return f"{limit}: ending the run" if (limit := self.deadline()) else ""
