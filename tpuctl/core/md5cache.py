"""Local files' md5s cached by (path, size, mtime) in $TPUCTL_HOME/md5cache.json: an unchanged 1 GB corpus is not
re-read on every submit, and a file edited in place (same size, new mtime) is hashed again."""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Callable

from . import state


def file_md5(path: str, chunk: int = 1 << 20, progress: Callable[[int], None] = lambda n: None) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)
            progress(len(b))


class Md5Cache:
    def __init__(self) -> None:
        self.path = state.home() / "md5cache.json"
        try:
            self.data: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.lock = threading.Lock()
        self.dirty = False

    def known(self, path: Path) -> bool:
        """Whether md5(path) answers from the cache (the file unchanged since it was hashed)."""
        st = path.stat()
        hit = self.data.get(str(path.resolve()))
        return hit is not None and hit[0] == st.st_size and hit[1] == st.st_mtime_ns

    def md5(self, path: Path, progress: Callable[[int], None] = lambda n: None) -> str:
        st = path.stat()
        k = str(path.resolve())
        with self.lock:
            hit = self.data.get(k)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return str(hit[2])
        digest = file_md5(str(path), progress=progress)
        with self.lock:
            self.data[k] = [st.st_size, st.st_mtime_ns, digest]
            self.dirty = True
        return digest

    def save(self) -> None:
        if self.dirty:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(self.data))
            os.replace(tmp, self.path)
