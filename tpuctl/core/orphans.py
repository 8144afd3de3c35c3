"""Run data without a run: what a submit copied into `runs/<id>/data/` for a run whose job.json it never wrote.

`submit` marks a run as being submitted (`tpuctl/submitting/<id>`: host, pid, time) before it copies any data,
and removes the mark once the job.json is written, or with the run's data when it is stopped first (Ctrl-C,
a failed upload). A submit killed outright leaves the mark, and the mark is how `status`, `ls` and `down` find what
it left without listing the runs. Releases before the mark existed left such data unmarked: the first command that
finds no `tpuctl/orphans-checked` lists the run data once, marks what has no job.json, and records the check.
The blobs an orphan's data was copied from stay: they are content, reused by the next submit that sends it.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

from . import layout, runs
from .processes import running
from .store import BlobStore

FOREIGN_GRACE = 24 * 3600.0   # a mark made on another machine is taken for a submit still uploading this long


@dataclass
class Orphan:
    run_id: str
    files: int
    bytes: int
    left_by: str   # who left it, in words


def begin(store: BlobStore, run_id: str) -> None:
    store.write(layout.submitting(run_id), json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                                       "time": time.time()}).encode())


def end(store: BlobStore, run_id: str) -> None:
    """The run's job.json is written: its data belongs to it."""
    store.delete(layout.submitting(run_id))


def discard(store: BlobStore, run_id: str) -> tuple[int, int]:
    """Removes the data of a run that was never submitted, then its mark; returns (files, bytes) removed."""
    keys = store.list(layout.run_data(run_id))
    for key, _ in keys:
        store.delete(key)
    store.delete(layout.submitting(run_id))
    return len(keys), sum(size for _, size in keys)


def find(store: BlobStore, repair: bool = True) -> list[Orphan]:
    """Every run's data whose submit stopped before its job.json, oldest first; a submit still under way (its
    process alive here, or a mark from another machine younger than FOREIGN_GRACE) is not one. `repair=False`
    (`tpuctl ui`, which only reads) writes nothing: what an earlier release left is found, not marked, and the mark
    of a run since written is left for the next command to take away."""
    unmarked = _mark_unmarked(store, repair) if store.read(layout.ORPHANS_CHECKED) is None else []
    found = []
    keys = [k for k, _ in store.list(layout.SUBMITTING_PREFIX)] + [layout.submitting(r) for r in unmarked]
    for key in sorted(keys):
        run_id = key[len(layout.SUBMITTING_PREFIX):]
        if runs.job(store, run_id) is not None:
            if repair:
                end(store, run_id)   # written, and the submit died before it took its mark away
            continue
        mark: dict[str, object] = {"left_by": EARLIER} if run_id in unmarked else runs.read_object(store, key)
        left_by = _left_by(mark)
        if left_by:
            data = store.list(layout.run_data(run_id))
            found.append(Orphan(run_id, len(data), sum(size for _, size in data), left_by))
    return found


def _left_by(mark: dict[str, object]) -> str:
    """Why a marked run is an orphan, or "" while its submit may still be going."""
    if mark.get("left_by"):
        return str(mark["left_by"])
    try:
        host, pid, made = str(mark.get("host", "")), int(str(mark.get("pid") or 0)), float(str(mark.get("time") or 0))
    except ValueError:
        return "a submit whose mark is unreadable"   # read_object gave {} for a corrupt one; a wrong shape lands here
    if host == socket.gethostname():
        if pid and running(pid):
            return ""
        return f"a submit on this machine (pid {pid}) that stopped before the run was written"
    if time.time() - made < FOREIGN_GRACE:
        return ""
    return f"a submit on {host or 'another machine'} that stopped before the run was written"


EARLIER = "a submit of an earlier tpuctl that stopped before the run was written"


def _mark_unmarked(store: BlobStore, write: bool = True) -> list[str]:
    """Once per store: the run data that an earlier release left without a run (one listing of all run data),
    marked and the check recorded (unless `write` is False); returns those not marked (when not written)."""
    ids = {parts[1] for key, _ in store.list(layout.OUTPUTS_PREFIX)
           if len(parts := key.split("/")) > 3 and key.startswith(layout.run_data(parts[1]))}
    marked = {key[len(layout.SUBMITTING_PREFIX):] for key, _ in store.list(layout.SUBMITTING_PREFIX)}
    left = [r for r in sorted(ids - marked) if runs.is_id(r) and runs.job(store, r) is None]
    if not write:
        return left
    for run_id in left:
        store.create(layout.submitting(run_id), json.dumps({"left_by": EARLIER}).encode())
    store.write(layout.ORPHANS_CHECKED, json.dumps({"time": time.time()}).encode())
    return []


def remove_all(store: BlobStore) -> tuple[int, int, int]:
    """Removes every orphan's data: (runs, files, bytes)."""
    gone = [discard(store, o.run_id) for o in find(store)]
    return len(gone), sum(f for f, _ in gone), sum(b for _, b in gone)
