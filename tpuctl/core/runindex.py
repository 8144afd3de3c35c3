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
"""
from __future__ import annotations

from . import layout, runs
from .store import BlobStore

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


def queued(store: BlobStore, ensured: bool = False) -> list[str]:
    """Unfinished runs (and finished ones not yet settled), oldest first."""
    if not ensured:
        ensure(store)
    return [k[len(layout.QUEUE_PREFIX):] for k, _ in store.list(layout.QUEUE_PREFIX)]


def newest(store: BlobStore, limit: int | None = None) -> list[str]:
    """The `limit` most recently submitted runs (None: all), newest first, from one short listing."""
    ensure(store)
    return [flip(k.rsplit("/", 1)[1]) for k, _ in store.list(layout.RUN_INDEX_PREFIX, limit)]


def latest(store: BlobStore) -> str | None:
    ids = newest(store, 1)
    return ids[0] if ids else None


def all_ids(store: BlobStore) -> list[str]:
    """Every run, oldest first (`down` of a Kaggle cluster, TensorBoard over all runs)."""
    return newest(store)[::-1]


def unfinished(store: BlobStore) -> list[str]:
    """Runs whose worker-0 status is not final, oldest first; the settled ones leave the queue on the way."""
    left = []
    for run_id in queued(store):
        if runs.status(store, run_id).state.final:
            settle(store, run_id)
        else:
            left.append(run_id)
    return left


def settle(store: BlobStore, run_id: str, workers: int | None = None) -> bool:
    """Takes a run off the queue once every worker that runs it is final: worker 0 for a TensorFlow run (the only
    one that runs it), every worker of the slice otherwise (`workers`, else the cluster record's `hosts`).
    Returns whether it is off the queue."""
    job = runs.job(store, run_id)
    if job is None or job.framework == "tensorflow":
        workers = 1
    elif workers is None:
        try:
            record = runs.read_object(store, layout.CLUSTER_RECORD)
            workers = int(record.get("hosts") or 1) * int(record.get("slices") or 1)   # every host of every slice
        except (TypeError, ValueError):
            workers = 1
    if all(runs.status(store, run_id, w).state.final for w in range(workers)):
        store.delete(layout.queue_entry(run_id))
        return True
    return False
