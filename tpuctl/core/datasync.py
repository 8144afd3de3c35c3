"""A run's data: each file's content uploaded once as a blob (tpuctl/blobs/<md5>), then copied into the run's own
directory (runs/<id>/data/<path>) by the store itself (a server-side copy on GCS, a hard link locally). So a run
sees exactly what was submitted with it: a later submit that changes or removes a file never touches an earlier
run's view, and unchanged content is never sent twice (local md5s are cached, md5cache.py)."""
from __future__ import annotations

import os
import queue
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from . import interrupts, knobs, layout
from .md5cache import Md5Cache
from .store import BlobStore

WORKERS = 16   # contents handled at once: each uploads its blob if the store lacks it, then makes its copies
Transfer = Callable[[int], Callable[[int], None]]   # transfer(total_bytes) -> advance(n_bytes)


def plan(paths: list[Path], names: list[str]) -> list[tuple[Path, str]]:
    """(local file, path under the run's data directory) for every file under the data paths, each placed at its
    name (jobspec.JobSpec.data_as); a directory's files keep their paths inside it."""
    out = []
    for p, name in zip(paths, names):
        if p.is_file():
            out.append((p, name))
            continue
        for dirpath, dirnames, files in os.walk(p):
            dirnames.sort()
            for f in sorted(files):
                full = Path(dirpath) / f
                out.append((full, f"{name}/{full.relative_to(p).as_posix()}"))
    return out


def hash_shown_bytes() -> int:
    """Hashing at least this much not hashed before shows progress (TPUCTL_HASH_PROGRESS_BYTES; 8 MB, ~0.02 s):
    a first submit of a 500 MB file showed a blank terminal for ~2.8 s while it was hashed (issue 40)."""
    return knobs.count("TPUCTL_HASH_PROGRESS_BYTES", 8_000_000)


def contents(files: list[tuple[Path, str]],
             hashing: Transfer | None = None) -> dict[str, tuple[Path, int, list[str]]]:
    """md5 -> (a local file with that content, its size, every data path that holds it). `hashing(total)` shows
    the progress of hashing what the md5 cache does not know, when that is worth showing."""
    cache = Md5Cache()
    fresh = sum(path.stat().st_size for path, _ in files if not cache.known(path))
    advance = hashing(fresh) if hashing is not None and fresh and fresh >= hash_shown_bytes() else (lambda n: None)
    by_md5: dict[str, tuple[Path, int, list[str]]] = {}
    for path, rel in files:
        md5 = cache.md5(path, advance)
        by_md5.setdefault(md5, (path, path.stat().st_size, []))[2].append(rel)
    cache.save()
    return by_md5


def stored(store: BlobStore) -> set[str]:
    """The md5s whose blobs the store holds: one listing."""
    return {k[len(layout.BLOBS_PREFIX):] for k in store.stats(layout.BLOBS_PREFIX)}


class Interrupted(Exception):
    """A sync stopped part way (Ctrl-C): how far it got. The blobs sent stay (content-addressed: the next sync does
    not send them again); copies made into the run's directory are the caller's to remove."""

    def __init__(self, stored: int, missing: int, bytes_sent: int) -> None:
        super().__init__(f"{stored} of {missing} contents sent")
        self.stored, self.missing, self.bytes_sent = stored, missing, bytes_sent


class _Stopped(Exception):
    """Raised inside a worker once the sync is stopped: it ends where it is."""


class _Gate:
    """Copies into the run's directory go on in parallel until the gate closes; close() waits for the copies already
    begun, so none lands after the caller has removed the run's data."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.open, self.inside = True, 0

    @contextmanager
    def passing(self) -> Iterator[None]:
        with self.cond:
            if not self.open:
                raise _Stopped()
            self.inside += 1
        try:
            yield
        finally:
            with self.cond:
                self.inside -= 1
                self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.open = False
            while self.inside:
                self.cond.wait()


def sync(store: BlobStore, paths: list[Path], names: list[str], run_id: str, transfer: Transfer,
         hashing: Transfer | None = None) -> dict[str, int]:
    """Upload the blobs the store lacks and give the run its copies, pipelined per content (a copy follows its
    blob's upload at once); returns counts and bytes sent/skipped. Interrupted (Ctrl-C) raises Interrupted once no
    copy is in flight; an upload in flight is abandoned (a half-sent object never appears: a GCS upload completes
    or creates nothing, a local one lands by rename)."""
    files = plan(paths, names)
    by_md5 = contents(files, hashing)
    have = stored(store)
    missing = [md5 for md5 in by_md5 if md5 not in have]
    sent = sum(by_md5[md5][1] for md5 in missing)
    advance = transfer(sent) if missing else (lambda n: None)
    gate = _Gate()
    done: list[str] = []

    def moved(n: int) -> None:
        if not gate.open:
            raise _Stopped()   # a local copy stops within a MiB
        advance(n)

    def one(md5: str) -> None:
        path, _, rels = by_md5[md5]
        if md5 not in have:
            store.upload_file(str(path), layout.blob(md5), moved)
            done.append(md5)
        for rel in rels:
            with gate.passing():
                store.copy(layout.blob(md5), layout.run_data(run_id) + rel)
    try:
        _each(one, list(by_md5), WORKERS, gate.close)
    except KeyboardInterrupt:
        raise Interrupted(len(done), len(missing), sum(by_md5[md5][1] for md5 in done)) from None
    skipped = sum(size * len(rels) for md5, (_, size, rels) in by_md5.items() if md5 in have)
    return {"files": len(files), "uploaded": len(missing), "bytes_sent": sent, "bytes_skipped": skipped}


def stop_wait() -> float:
    """How long an interrupted sync waits for its uploads in flight to stop (TPUCTL_STOP_WAIT, 5 s): a local copy
    stops within a MiB and removes its partial file; a GCS upload cannot stop part way, and is abandoned at exit
    (Cloud Storage makes no object of an upload that never completed)."""
    return knobs.number("TPUCTL_STOP_WAIT", 5)


def _each(work: Callable[[str], None], items: list[str], workers: int, stop: Callable[[], None]) -> None:
    """work(item) for every item on up to `workers` daemon threads; the first failure is raised once every thread
    has stopped taking items. On a failure or Ctrl-C, stop() is called (with Ctrl-C held) before the threads are
    waited for, at most stop_wait() seconds. Daemon threads, unlike a ThreadPoolExecutor's: an interrupted submit
    need not wait for a large upload in flight."""
    todo = queue.SimpleQueue[str]()
    for item in items:
        todo.put(item)
    failed: list[BaseException] = []

    def worker() -> None:
        while not failed:
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                work(item)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread, which raises it
                failed.append(e)
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(workers, len(items)))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)   # in slices: a Ctrl-C reaches this thread at once
    except BaseException as e:
        failed.append(e)
    if failed:
        with interrupts.held():   # a second Ctrl-C while what is in flight stops
            stop()
            deadline = time.monotonic() + stop_wait()
            for t in threads:
                if t.ident is not None:   # started (Ctrl-C may come while they are being started)
                    t.join(max(0.0, deadline - time.monotonic()))
        raise failed[-1] if isinstance(failed[-1], KeyboardInterrupt) else failed[0]
