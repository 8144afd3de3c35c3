"""A cluster armed for recovery (`up --recover`): its record in the store (layout.WATCH_ARMED), which the watcher,
`submit`, `status` and `down` read and change, each by a conditional write so no change is lost to another
machine's; and each recovery's record (layout.recovery).

The record holds the cluster's state as the last writer knew it: the watcher may run on another machine (a watcher
VM has no state of its own) and may move the compute to another zone; the CLI takes the newer state from it
(`sync`), so `down` deletes where the compute is now.

    {"armed": true, "armed_at": T, "max_recoveries": 5, "until": T|0, "run": ID|"", "recoveries": 1,
     "watcher": "local"|"vm", "state": {...}, "ended": ""|why, "ended_at": T, "teardown": bool,
     "recovering": {...}|{} (control/recovering.py)}
"""
from __future__ import annotations

import json
import secrets
import time
from typing import Any, Callable

from ..core import layout, state
from ..core.models import ClusterState
from ..core.store import BlobStore

DEFAULT_MAX_RECOVERIES = 5
# Where the watcher runs (`up --recover --watcher`): wherever `tpuctl watch` is started, or a VM of its own that the
# provider makes (providers/base.py WatcherHost). Not an architecture: a TPU VM is models.Arch.
ON_MACHINE, ON_VM = "local", "vm"
WATCHERS = (ON_MACHINE, ON_VM)


def read(store: BlobStore) -> dict[str, Any] | None:
    raw = store.read(layout.WATCH_ARMED)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def update(store: BlobStore, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any] | None:
    """Read, change, write back only if nobody wrote in between (else again). `change` returns None to write
    nothing."""
    while True:
        raw, gen = store.read_generation(layout.WATCH_ARMED)
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {}
        new = change(dict(doc))
        if new is None:
            return doc or None
        # a write of its own (write_if takes an object holding our bytes for our lost-answer retry's)
        new["write"] = secrets.token_hex(8)
        if store.write_if(layout.WATCH_ARMED, json.dumps(new).encode(), gen):
            return new


def arm(store: BlobStore, st: ClusterState, max_recoveries: int, until: float, watcher: str) -> dict[str, Any]:
    """(Re-)arm: a new watch, its count from zero; the run it is for is the next one submitted, or the one
    running now."""
    from ..core import runindex
    active = runindex.unfinished(store)
    doc = {"armed": True, "armed_at": time.time(), "max_recoveries": max_recoveries, "until": until,
           "run": active[-1] if active else "", "recoveries": 0, "watcher": watcher, "state": st.to_json(),
           "ended": "", "ended_at": 0.0}
    update(store, lambda old: doc)
    return doc


def live(doc: dict[str, Any] | None) -> bool:
    return bool(doc and doc.get("armed") and not doc.get("ended"))


def end(store: BlobStore, why: str, teardown: bool = False) -> None:
    """The watch is over (down, the run ended, the host stopped itself, limits): watchers exit and `status` says
    why. `teardown` (`down`): the compute is going, so a watcher undoes a re-create it finishes after this."""
    def change(doc: dict[str, Any]) -> dict[str, Any] | None:
        if not live(doc):
            return None
        return {**doc, "ended": why, "ended_at": time.time(), "teardown": teardown}
    update(store, change)


def for_run(store: BlobStore, run_id: str) -> None:
    """`submit` on an armed cluster: the first run submitted after arming is the one the watch is for."""
    def change(doc: dict[str, Any]) -> dict[str, Any] | None:
        return {**doc, "run": run_id} if live(doc) and not doc.get("run") else None
    update(store, change)


def save_state(store: BlobStore, st: ClusterState) -> None:
    update(store, lambda doc: {**doc, "state": st.to_json()} if doc else None)


def sync(st: ClusterState, store: BlobStore, save: bool = True) -> ClusterState:
    """The newer of the local state and the one a watcher left in the store (the compute's latest period decides);
    saved locally when the store's is newer (unless `save` is False: `tpuctl ui` only reads)."""
    try:
        doc = read(store)
    except Exception:  # noqa: BLE001 - a store that cannot be read leaves the local state as it is
        return st
    if not doc or "state" not in doc:
        return st
    theirs = ClusterState.from_json(doc["state"])
    newer = (theirs.periods[-1][0] if theirs.periods else 0) > (st.periods[-1][0] if st.periods else 0)
    if not newer:
        return st
    st.zone, st.runtime, st.host, st.periods = theirs.zone, theirs.runtime, theirs.host, theirs.periods
    st.grants = st.grants + [g for g in theirs.grants if g not in st.grants]
    if save:
        state.save(st)
    return st


def record_recovery(store: BlobStore, rec: dict[str, Any]) -> int:
    """Writes the next recovery record (create-if-absent: two writers never share a number); returns its number."""
    n = len(store.list(layout.RECOVERIES_PREFIX)) + 1
    while not store.create(layout.recovery(n), json.dumps({**rec, "n": n}).encode()):
        n += 1
    return n


def recoveries(store: BlobStore) -> list[dict[str, Any]]:
    out = []
    for key, _ in store.list(layout.RECOVERIES_PREFIX):
        try:
            out.append(json.loads(store.read(key) or b"{}"))
        except ValueError:
            continue
    return out


def recovery_line(rec: dict[str, Any]) -> str:
    """A recovery in words, the same in the watcher's log and in `status`: why, where the compute came back, and one
    measure of how long it took: from the lost host's last heartbeat (else from when the loss was seen) to the
    re-created compute (`gone_seconds`)."""
    where = f" on {rec['where']}" if rec.get("where") else (f" in {rec['zone']}" if rec.get("zone") else "")
    return f"{rec.get('lost')}; back{where} after {float(rec.get('gone_seconds', 0)):.0f}s without compute"


def runs_at_risk(store: BlobStore) -> dict[str, int]:
    """The unfinished runs when the compute was lost, each with how many training attempts its metrics.json
    recorded by then (the next one is the resumption: resumption())."""
    from ..core import metrics, runindex
    out = {}
    for run_id in runindex.unfinished(store):
        m = metrics.parse(store.read(layout.run_metrics(run_id)))
        out[run_id] = len(m.attempts) if m else 0
    return out


def resumption(store: BlobStore, rec: dict[str, Any]) -> str:
    """How the runs a recovery interrupted started training again, from their metrics.json: "run X resumed from
    its checkpoint at step N" or "... from the start"; "" while none has (or for a job that writes no metrics)."""
    from ..core import metrics
    said = []
    for run_id, before in dict(rec.get("runs") or {}).items():
        m = metrics.parse(store.read(layout.run_metrics(run_id)))
        if m is None or len(m.attempts) <= int(before):
            continue
        step = int(m.attempts[int(before)]["from"])
        said.append(f"run {run_id} resumed " + (f"from its checkpoint at step {step}" if step else "from the start"))
    return "; ".join(said)
