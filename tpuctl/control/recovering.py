"""The re-create in flight: the armed record's `recovering` mark (control/armed.py), which says that a watcher is
re-creating the compute and is alive (its keeper renews `renewed` while the re-create runs, lease or no lease).

The lease alone cannot say it: a damaged lease (deleted, garbled, its expiry zeroed) is free to whoever writes it
first, so a second watcher, or `down`, may hold it while the first is still inside a create. So:
- a watcher that finds a live mark not its own stands by; one whose owner stopped renewing it (killed mid-re-create)
  is taken over, by a conditional write, by one watcher;
- a recovery is counted once, by whoever clears the mark it began (two watchers never both count one preemption
  against --max-recoveries);
- `down` ends the watch first (the record the watcher reads before each create), then waits for a live mark to clear
  (the watcher undoes a create the ended watch no longer wants), then deletes.

    "recovering": {"id": TOKEN, "by": LEASE_ID, "renewed": T, "lost": why, "detected_at": T, "zone_before": Z}
"""
from __future__ import annotations

import secrets
import time
from typing import Any, Callable

from ..core.lease import ttl_seconds
from ..core.store import BlobStore
from . import armed


def _live(mark: dict[str, Any] | None) -> bool:
    """Renewed within a lease's ttl: its watcher is alive (a mark of an earlier release has no `renewed`)."""
    return bool(mark) and time.time() - float((mark or {}).get("renewed", 0)) < ttl_seconds()


def in_flight(doc: dict[str, Any] | None, me: str = "") -> bool:
    """Whether another watcher (not `me`) is re-creating the compute now."""
    mark = (doc or {}).get("recovering") or {}
    return _live(mark) and mark.get("by") != me


class Mark:
    def __init__(self, store: BlobStore, rec: dict[str, Any]) -> None:
        self.store, self.rec = store, rec

    @classmethod
    def begin(cls, store: BlobStore, me: str, lost: str, zone_before: str, state: dict[str, Any]) -> "Mark | None":
        """A new recovery; None when one is in flight already (someone else's, or a dead one's to take over)."""
        now = time.time()
        rec = {"id": secrets.token_hex(6), "by": me, "renewed": now, "lost": lost, "detected_at": now,
               "zone_before": zone_before}
        return cls._put(store, rec, lambda d: not d.get("recovering"), state)

    @classmethod
    def adopt(cls, store: BlobStore, me: str, pending: dict[str, Any]) -> "Mark | None":
        """The recovery a watcher that stopped renewing it began; None when another took it (or it is live)."""
        rec = {**pending, "id": pending.get("id") or secrets.token_hex(6), "by": me, "renewed": time.time()}
        return cls._put(store, rec, lambda d: (d.get("recovering") or {}) == pending and not _live(pending))

    @classmethod
    def _put(cls, store: BlobStore, rec: dict[str, Any], ok: Callable[[dict[str, Any]], bool],
             state: dict[str, Any] | None = None) -> "Mark | None":
        def change(d: dict[str, Any]) -> dict[str, Any] | None:
            if not d or not ok(d):
                return None
            return {**d, "recovering": rec, **({"state": state} if state is not None else {})}
        doc = armed.update(store, change) or {}
        return cls(store, rec) if (doc.get("recovering") or {}).get("id") == rec["id"] else None

    def _mine(self, d: dict[str, Any]) -> bool:
        return bool(d) and (d.get("recovering") or {}).get("id") == self.rec["id"]

    def renew(self) -> None:
        """Called by the lease keeper while the re-create runs."""
        self.rec = {**self.rec, "renewed": time.time()}
        armed.update(self.store, lambda d: {**d, "recovering": self.rec} if self._mine(d) else None)

    def finish(self, state: dict[str, Any]) -> bool:
        """The compute is back: count the recovery, once. False when it was not ours to count any more."""
        def change(d: dict[str, Any]) -> dict[str, Any] | None:
            if not self._mine(d):
                return None
            return {**d, "recoveries": int(d.get("recoveries", 0)) + 1, "recovering": {}, "state": state}
        return (armed.update(self.store, change) or {}).get("recovering") == {}

    def drop(self) -> None:
        """No recovery after all (the watch ended): the mark goes, if it is still ours."""
        armed.update(self.store, lambda d: {**d, "recovering": {}} if self._mine(d) else None)


def wait_settled(store: BlobStore, timeout: float, waiting: Callable[[str], None], poll: float = 0.2) -> None:
    """`down`, once the watch is ended: wait (up to `timeout`) while a live watcher is inside a re-create, which it
    stops before its next create and undoes once done; a dead one's mark goes stale within a lease's ttl."""
    deadline = time.monotonic() + timeout
    told = False
    while in_flight(armed.read(store)) and time.monotonic() < deadline:
        if not told:
            waiting("waiting for the recovery watcher to stop the re-create it is in")
            told = True
        time.sleep(poll)
