"""What a Kaggle run keeps in the cluster's store, which `logs`, `jobs` and `download` read as for every provider: its
record (layout.run_remote: its dataset, its sessions and their states), its log chunks, its status; and the lease by
which one tpuctl at a time moves it on (layout.run_remote_lease)."""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from ...core import layout, runindex
from ...core.lease import Lease
from ...core.runs import RunState, RunStatus
from ...core.store import BlobStore

run_record = layout.run_remote


def save(store: BlobStore, run_id: str, rec: dict[str, Any]) -> None:
    store.write(run_record(run_id), json.dumps(rec).encode())


def chunk(store: BlobStore, run_id: str, rec: dict[str, Any], text: str) -> None:
    """The run's log's next chunk (its number kept in the record)."""
    rec["chunks"] += 1
    store.create(layout.log_chunk(run_id, 0, rec["chunks"]), text.encode())
    save(store, run_id, rec)


def line(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def status(store: BlobStore, run_id: str, rec: dict[str, Any], state: RunState, code: int | None = None,
           note: str = "") -> None:
    """The run's status.json, timed from its first session; a final one settles the run's queue entry."""
    now = time.time()
    first = rec["sessions"][0] if rec["sessions"] else {"pushed": now}
    store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(
        state=state, exit_code=code, started=first.get("started", first["pushed"]),
        ended=now if state.final else None, heartbeat=now, host="kaggle",
        attempt=max(1, len(rec["sessions"])), note=note).to_json()).encode())
    if state.final:
        runindex.settle(store, run_id, 1)


def gone(store: BlobStore, run_id: str, rec: dict[str, Any], reason: str, state: RunState = RunState.ENDED) -> None:
    """The run's compute is gone for good (or was never had: FAILED): it ends, saying why, and its time stops."""
    if rec["sessions"]:
        rec["sessions"][-1]["state"] = "GONE"
    chunk(store, run_id, rec, f"--- ended: {reason} ---\n")
    status(store, run_id, rec, state, None, note=f"ended: {reason}")


def words(rec: dict[str, Any], s: dict[str, Any]) -> str:
    """The session's state in words, as `submit` and `logs -f` show it while they follow."""
    since = s.get("started", s["pushed"])
    return f"Kaggle session {len(rec['sessions'])}: {s['state']} {time.time() - since:.0f}s"


class Holder:
    """The runs this tpuctl moves on. One tpuctl at a time, or a `watch` and a `logs -f` of the same run would both
    push its next session and both write its log (one chunk number each: lines lost or twice). A lease on the run
    (core/lease.py), renewed once a third of its time has passed (GCS takes about one write a second to an object);
    a follower keeps it, a one-off look (`jobs`) gives it back; a holder that died lapses after
    TPUCTL_LEASE_SECONDS."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[Lease, float]] = {}   # run -> (its lease, ours until)

    def take(self, store: BlobStore, run_id: str) -> bool | None:
        """True: taken now (what another holder wrote before is to be read again); False: held already; None:
        another tpuctl holds it."""
        held = self.held.get(run_id)
        lease = held[0] if held else Lease(store, layout.run_remote_lease(run_id),
                                           f"{socket.gethostname()} (pid {os.getpid()})")
        if held and time.time() < held[1] - lease.ttl * 2 / 3:
            return False
        if not lease.acquire():   # taken when free, renewed when ours
            self.held.pop(run_id, None)
            return None
        self.held[run_id] = (lease, time.time() + lease.ttl)
        return held is None

    def let_go(self, run_id: str) -> None:
        held = self.held.pop(run_id, None)
        if held:
            held[0].release()
