"""A Kaggle run's inputs: one private dataset, named by the hash of its contents (sessions.py makes the files).

Kaggle processes a dataset after CreateDataset has answered (GetDatasetStatus: NOT_YET_PERSISTED, BLOBS_RECEIVED,
... READY or FAILED; kagglesdk datasets/types/dataset_enums.py `DatabundleVersionStatus`; the kaggle client says
the dataset "is being created" and to check later), and a session pushed before it is READY gets it back in
`invalid_dataset_sources`. So a session is pushed only once its dataset is READY, a FAILED one is made again, and
one not READY is never taken as there. Private datasets count against the account's private storage: the dataset of
a run that has ended is deleted unless a run not finished uses it or a run that used it asked to keep it
(`submit --keep-inputs`); `down` deletes the rest (the store's list, layout.REMOTE_DATASETS).
"""
from __future__ import annotations

import io
import json
import secrets
import tarfile
import time
from typing import Any, Callable

from ...core import knobs, layout, runindex
from ...core.errors import ErrorKind, TpuctlError
from ...core.store import BlobStore
from ...core.sizes import human_bytes
from .client import Kaggle

DATASETS = layout.REMOTE_DATASETS


def ensure(k: Kaggle, slug: str, title: str, files: dict[str, bytes], progress: Callable[[str], None],
           remember: Callable[[str], None] = lambda slug: None) -> str:
    """The dataset `slug` holding `files`, READY on Kaggle: reused when READY, waited for while Kaggle processes
    it, made again when Kaggle's processing FAILED (twice: an error). A slug Kaggle still holds after its deletion
    (issue 39 item 5: whether a deleted dataset's slug and title are free again is not established; one report says
    a deleted title stayed taken, and GetDatasetStatus may answer DELETED, a DatabundleVersionStatus of kagglesdk
    datasets/types/dataset_enums.py) gets a fresh slug and title at once, never the 30-minute wait for READY.
    Returns the slug used; `remember` records a fresh one before it is made (`down` deletes it)."""
    for _ in range(2):
        state = k.dataset_status(slug)
        if state == "DELETED":
            slug, title = _fresh(slug, title, progress, remember)
            state = ""
        if state == "FAILED":
            progress(f"dataset {slug}: Kaggle failed to process it; deleting it and uploading it again")
            k.delete_dataset(slug)
            state = ""
        if state == "READY":
            progress(f"dataset {slug} unchanged: nothing uploaded")
            return slug
        if not state:
            size = sum(len(b) for b in files.values())
            progress(f"uploading dataset {slug} ({human_bytes(size)}, private)")
            try:
                k.create_dataset(slug, title, files)
            except TpuctlError as e:
                # refused while GetDatasetStatus says it is not there (or DELETED): the slug or title is still
                # held by a deleted dataset; any other refusal stands
                if e.kind is not ErrorKind.REFUSED or k.dataset_status(slug) not in ("", "DELETED"):
                    raise
                slug, title = _fresh(slug, title, progress, remember)
                k.create_dataset(slug, title, files)
        if wait_ready(k, slug, progress):
            return slug
    raise TpuctlError(ErrorKind.ERROR, f"Kaggle failed to process dataset {slug} twice",
                      "submit again later; `tpuctl down` deletes what is left of it")


def _fresh(slug: str, title: str, progress: Callable[[str], None],
           remember: Callable[[str], None]) -> tuple[str, str]:
    """A slug and title of the same contents that no deleted dataset holds: a random suffix on both (the title's slug
    is the slug, as Kaggle derives one from the other; 6-50 characters, kaggle_api_extended dataset create)."""
    suffix = secrets.token_hex(3)
    progress(f"dataset {slug}: Kaggle still holds the name of a deleted one; using {slug}-{suffix}")
    remember(f"{slug}-{suffix}")
    return f"{slug}-{suffix}", f"{title} {suffix}"


def wait_ready(k: Kaggle, dataset: str, progress: Callable[[str], None]) -> bool:
    """Waits while Kaggle processes the dataset: True once READY, False if it FAILED; TpuctlError after
    TPUCTL_KAGGLE_DATASET_WAIT seconds (1800). Polls as kaggle_api_extended `_adaptive_sleep` does: from
    TPUCTL_KAGGLE_POLL (5 s, its `_ADAPTIVE_POLL_START`), x1.5 a poll, to 30 s."""
    limit = knobs.number("TPUCTL_KAGGLE_DATASET_WAIT", 1800)
    pause, start, said = knobs.number("TPUCTL_KAGGLE_POLL", 5), time.time(), ""
    while True:
        state = k.dataset_status(dataset)
        if state in ("READY", "FAILED"):
            return state == "READY"
        if state != said:
            progress(f"dataset {dataset}: Kaggle is processing it ({state or 'not listed yet'}, "
                     f"{time.time() - start:.0f}s)")
            said = state
        if time.time() - start > limit:
            raise TpuctlError(ErrorKind.TIMEOUT, f"Kaggle has not finished processing dataset {dataset} after "
                              f"{limit:.0f}s ({state})", "submit again later: the dataset is reused once READY")
        time.sleep(pause)
        pause = min(pause * 1.5, 30.0)


def remember(store: BlobStore, slug: str) -> None:
    """Recorded before it is made: `down` deletes it even if the answer is lost."""
    known = json.loads(store.read(DATASETS) or b"[]")
    if slug not in known:
        store.write(DATASETS, json.dumps(known + [slug]).encode())


def release(store: BlobStore, run_id: str, rec: dict[str, Any], k: Kaggle | None = None) -> None:
    """Deletes the ended run's dataset unless it is to be kept (the module's docstring). Best effort: what is left,
    `status` lists and `down` deletes."""
    slug = rec["dataset"]
    if not slug or rec.get("keep"):
        return
    unfinished = set(runindex.unfinished(store))
    for other in runindex.all_ids(store):
        raw = store.read(layout.run_remote(other)) if other != run_id else None
        them = json.loads(raw) if raw else {}
        if them.get("dataset") == slug and (them.get("keep") or other in unfinished):
            return
    try:
        (k or Kaggle()).delete_dataset(slug)
    except TpuctlError:
        return
    known = json.loads(store.read(DATASETS) or b"[]")
    store.write(DATASETS, json.dumps([d for d in known if d != slug]).encode())


def holdings(store: BlobStore, user: str) -> dict[str, list[str]]:
    """What tpuctl made on Kaggle for the cluster and has not deleted, as its store records it (`down` deletes it
    all): `status` shows it."""
    kernels = [s["kernel"] for run_id in runindex.all_ids(store)
               for s in json.loads(store.read(layout.run_remote(run_id)) or b'{"sessions": []}')["sessions"]
               if s["state"] not in ("REFUSED", "GONE", "CANCEL_ACKNOWLEDGED")]
    return {"datasets": [f"{user}/{d}" for d in json.loads(store.read(DATASETS) or b"[]")],
            "kernels": [f"{user}/{slug}" for slug in kernels]}


def tar_files(files: dict[str, bytes]) -> bytes:
    """Deterministic: the same files always make the same bytes (so the same dataset name)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(files[name]), 0, 0o644
            t.addfile(info, io.BytesIO(files[name]))
    return raw.getvalue()
