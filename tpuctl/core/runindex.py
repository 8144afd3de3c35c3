"""Two small indexes beside the runs, so that what a command reads does not grow with the store's history (a
long-lived cluster used for sweeps holds tens of thousands of finished runs):

- the queue, `tpuctl/queue/<id>`: one object per unfinished run, listed oldest first. The agent takes runs from it
  first-in first-out and looks for take-overs in it; the watcher asks it whether anything is left. An entry is
  removed once every worker that runs the run has a final status (`settle`), by whoever sees that first.
- the newest-first index, `tpuctl/index/runs/<flipped month>/<flipped id>`: one object per run, named by its id
  with every digit d written 9-d and every hex digit x written f-x, so a listing in key order (as GCS and a
  directory both list) starts with the newest run: `jobs` and `logs` list only the first few keys, never the whole
  prefix (the month folder keeps a directory store from reading every run's name to find the first).

`submit` writes both right after `job.json` (the run exists once its job.json does; a submit killed between the
two leaves a run nobody was told of, which a rebuild indexes). A store made before the indexes existed, or that
lost them, is indexed once from a full listing by the first command that finds no `tpuctl/index/complete`.

So an entry whose name is not a run id, or whose run has no job.json, was planted by hand or by something else
(job.json is written before either entry): whoever meets it removes it and says so once (`report`), and it never
shows as a run nor stays in the queue.
"""
from __future__ import annotations

import sys
from typing import Callable

from . import backends, layout, runs
from .store import BlobStore

Report = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"tpuctl: {message}", file=sys.stderr, flush=True)


def drop(store: BlobStore, key: str, why: str, report: Report = _stderr) -> None:
    """Removes an index or queue entry that names no run (see above), and says so."""
    store.delete(key)
    report(f"removed {key} from the run index: {why}")


def _ids(store: BlobStore, keys: list[str], id_of: Callable[[str], str], report: Report,
         repair: bool = True) -> list[str]:
    good = []
    for key in keys:
        run_id = id_of(key)
        if runs.is_id(run_id):
            good.append(run_id)
        elif repair:
            drop(store, key, "not a run id", report)
    return good

_FLIP = str.maketrans("0123456789abcdef", "9876543210fedcba")


def flip(run_id: str) -> str:
    """Its own inverse: flip(flip(x)) == x."""
    return run_id.translate(_FLIP)


def ensure(store: BlobStore) -> None:
    """One read: the marker. A command reads it each time (a store's index may be lost between commands); the
    agent once at start."""
    if store.read(layout.RUN_INDEX_COMPLETE) is None:
        rebuild(store)


def rebuild(store: BlobStore) -> int:
    """Indexes every run from one listing of all runs (the only full listing, made once per store); returns how
    many runs it found. Idempotent, and safe beside agents and submits doing the same."""
    ids = sorted({rid for k, _ in store.list(layout.RUNS_PREFIX) if (rid := layout.run_id_of(k))})
    for run_id in ids:
        store.create(layout.run_index(flip(run_id)), run_id.encode())
        if not runs.status(store, run_id).state.final:
            store.create(layout.queue_entry(run_id), run_id.encode())
    store.write(layout.RUN_INDEX_COMPLETE, str(len(ids)).encode())
    return len(ids)


def register(store: BlobStore, run_id: str) -> None:
    """A new run, after its job.json: queued for the agents, listed first by `jobs`."""
    ensure(store)
    store.create(layout.queue_entry(run_id), run_id.encode())
    store.create(layout.run_index(flip(run_id)), run_id.encode())


def queued(store: BlobStore, ensured: bool = False, report: Report = _stderr) -> list[str]:
    """Unfinished runs (and finished ones not yet settled), oldest first."""
    if not ensured:
        ensure(store)
    keys = [k for k, _ in store.list(layout.QUEUE_PREFIX)]
    return _ids(store, keys, lambda k: k[len(layout.QUEUE_PREFIX):], report)


def newest(store: BlobStore, limit: int | None = None, report: Report = _stderr, repair: bool = True) -> list[str]:
    """The `limit` most recently submitted runs (None: all), newest first, from one short listing (two when it
    began with entries that name no run). `repair=False` (`tpuctl ui`, which only reads) writes nothing: a store
    never indexed is read from one full listing of its runs instead, and entries that name no run are passed over
    (the next `jobs` removes them)."""
    if not repair:
        return _read_only_newest(store, limit)
    ensure(store)
    keys = [k for k, _ in store.list(layout.RUN_INDEX_PREFIX, limit)]
    ids = _ids(store, keys, lambda k: flip(k.rsplit("/", 1)[1]), report)
    return newest(store, limit, report) if limit and len(ids) < len(keys) else ids


def _read_only_newest(store: BlobStore, limit: int | None) -> list[str]:
    if store.read(layout.RUN_INDEX_COMPLETE) is None:
        every = sorted({rid for k, _ in store.list(layout.RUNS_PREFIX) if (rid := layout.run_id_of(k))},
                       reverse=True)
        return every[:limit] if limit else every
    listed = limit
    while True:   # a page with entries that name no run: list further, as far as the page needs
        keys = [k for k, _ in store.list(layout.RUN_INDEX_PREFIX, listed)]
        ids = _ids(store, keys, lambda k: flip(k.rsplit("/", 1)[1]), lambda m: None, repair=False)
        if not limit or not listed or len(ids) >= limit or len(keys) < listed:
            return ids[:limit] if limit else ids
        listed += limit


def forget(store: BlobStore, run_id: str, report: Report = _stderr) -> None:
    """A run id listed in the indexes whose job.json does not exist: out of both."""
    why = f"run {run_id} does not exist (no {layout.run_job(run_id)})"
    for key in (layout.run_index(flip(run_id)), layout.queue_entry(run_id)):
        if store.read(key) is not None:
            drop(store, key, why, report)


def latest(store: BlobStore, report: Report = _stderr) -> str | None:
    while (ids := newest(store, 1, report)) and runs.job(store, ids[0]) is None:
        forget(store, ids[0], report)
    return ids[0] if ids else None


# The shapes of run ids (runs.new_id): today's, then those of earlier releases; 9 is a digit, f a hex digit.
_SHAPES = ("99999999-999999-999-ffff", "99999999-999999-ffff")
SHORTEST = 4   # as git: a shorter form would match too much to mean one run


def _fits(part: str, shape: str) -> bool:
    return len(part) == len(shape) and all(
        c == "-" if s == "-" else (c.isdigit() if s == "9" else c in "0123456789abcdef") for c, s in zip(part, shape))


def _could_start(part: str) -> bool:
    return any(_fits(part, shape[:len(part)]) for shape in _SHAPES)


def _could_end(part: str) -> bool:
    return any(len(part) <= len(shape) and _fits(part, shape[len(shape) - len(part):]) for shape in _SHAPES)


def is_short_form(part: str) -> bool:
    """Whether `part` can be the start or the end of a run id (and is long enough to be taken as one)."""
    return len(part) >= SHORTEST and (_could_start(part) or _could_end(part))


def matching(store: BlobStore, part: str) -> list[str]:
    """The runs whose id starts or ends with `part` (a short form, is_short_form), newest first. A start is one
    listing of the index under that prefix (the index is keyed by the flipped id, and flipping keeps prefixes);
    an end can only be told from the whole index, listed once."""
    ensure(store)
    found: list[str] = []
    if _could_start(part):
        flipped = flip(part)
        prefix = layout.run_index(flipped) if len(flipped) >= 6 else layout.RUN_INDEX_PREFIX + flipped
        found += [flip(k.rsplit("/", 1)[1]) for k, _ in store.list(prefix)]
    if _could_end(part):
        found += [rid for rid in newest(store) if rid.endswith(part)]
    return sorted(set(found), reverse=True)


def all_ids(store: BlobStore) -> list[str]:
    """Every run, oldest first (`down` of a Kaggle cluster, TensorBoard over all runs)."""
    return newest(store)[::-1]


def unfinished(store: BlobStore, report: Report = _stderr) -> list[str]:
    """Runs whose worker-0 status is not final, oldest first; the settled ones leave the queue on the way, and
    entries whose run does not exist too."""
    left = []
    for run_id in queued(store, report=report):
        if runs.job(store, run_id) is None:
            forget(store, run_id, report)
        elif runs.status(store, run_id).state.final:
            settle(store, run_id)
        else:
            left.append(run_id)
    return left


def settle(store: BlobStore, run_id: str, workers: int | None = None) -> bool:
    """Takes a run off the queue once every worker that runs it is final: worker 0 for a TensorFlow run (the only
    one that runs it), every worker of the slice otherwise (`workers`, else the cluster record's `hosts`).
    Returns whether it is off the queue."""
    job = runs.job(store, run_id)
    record = runs.read_object(store, layout.CLUSTER_RECORD) if workers is None or \
        (job is not None and job.framework == "keras") else {}
    if job is None or backends.program_framework(job.framework, job.env, job.keras_backend, record) == "tensorflow":
        workers = 1
    elif workers is None:
        try:
            workers = int(record.get("hosts") or 1) * int(record.get("slices") or 1)   # every host of every slice
        except (TypeError, ValueError):
            workers = 1
    if all(runs.status(store, run_id, w).state.final for w in range(workers)):
        store.delete(layout.queue_entry(run_id))
        return True
    return False
