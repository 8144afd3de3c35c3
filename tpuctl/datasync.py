"""Sync a job's data paths into the store under data/<job>/ (layout.job_data): in parallel, skipping files whose
size and md5 already match, so re-submitting unchanged data sends nothing (local md5s cached, md5cache.py)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from .md5cache import Md5Cache
from .store import BlobStore

WORKERS = 8
Transfer = Callable[[int], Callable[[int], None]]   # transfer(total_bytes) -> advance(n_bytes)


def plan(paths: list[Path], prefix: str) -> list[tuple[Path, str]]:
    """(local file, store key) for every file under the data paths; a directory keeps its own name."""
    out = []
    for p in paths:
        if p.is_file():
            out.append((p, prefix + p.name))
            continue
        for dirpath, dirnames, files in os.walk(p):
            dirnames.sort()
            for f in sorted(files):
                full = Path(dirpath) / f
                out.append((full, prefix + p.name + "/" + full.relative_to(p).as_posix()))
    return out


def sync(store: BlobStore, paths: list[Path], prefix: str, transfer: Transfer) -> dict[str, int]:
    """Upload what differs; returns counts and bytes sent/skipped."""
    files = plan(paths, prefix)
    cache = Md5Cache()
    remote = store.stats(prefix)
    todo, skipped = [], 0
    for path, key in files:
        size = path.stat().st_size
        have = remote.get(key)
        if have and have[0] == size and have[1] == cache.md5(path):
            skipped += size
            continue
        todo.append((path, key, size))
    cache.save()
    sent = sum(s for _, _, s in todo)
    if todo:
        advance = transfer(sent)
        with ThreadPoolExecutor(min(WORKERS, len(todo))) as pool:
            for f in [pool.submit(store.upload_file, str(p), k, advance) for p, k, _ in todo]:
                f.result()
    return {"files": len(files), "uploaded": len(todo), "bytes_sent": sent, "bytes_skipped": skipped}
