"""Sync a job's data paths into the store under data/<job>/: in parallel, skipping files whose size and md5
already match, so re-submitting unchanged data sends nothing.

Local md5s are cached by (path, size, mtime) in $TPUCTL_HOME/md5cache.json: an unchanged 1 GB corpus is not
re-read on every submit.
"""
from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import state
from .store import file_md5

WORKERS = 8


class Md5Cache:
    def __init__(self):
        self.path = state.home() / "md5cache.json"
        try:
            self.data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.lock = threading.Lock()
        self.dirty = False

    def md5(self, path: Path) -> str:
        st = path.stat()
        k = str(path.resolve())
        with self.lock:
            hit = self.data.get(k)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return hit[2]
        digest = file_md5(str(path))
        with self.lock:
            self.data[k] = [st.st_size, st.st_mtime_ns, digest]
            self.dirty = True
        return digest

    def save(self):
        if self.dirty:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(self.data))
            os.replace(tmp, self.path)


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


def sync(store, paths: list[Path], prefix: str, transfer) -> dict:
    """transfer(total_bytes) -> advance(n) callback (a progress bar). Returns counts and bytes sent/skipped."""
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
