"""The store: the control plane every run goes through (DESIGN "The store is the control plane").

A store is a flat key space under a root URI: a GCS bucket (`gs://bucket`, providers/gcp/gcs_store.py) or a
directory (LocalStore below). Keys use '/' separators. The only consistency primitive is `create`
(create-if-absent: GCS `if_generation_match=0`, locally `O_CREAT|O_EXCL` on a fully written temp file's link),
which is what lets exactly one agent claim a run and keeps log chunks written once.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Protocol


class BlobStore(Protocol):
    uri: str

    def read(self, key: str) -> bytes | None:
        """The object's bytes, or None when absent."""
    def write(self, key: str, data: bytes) -> None:
        """Create or replace."""
    def create(self, key: str, data: bytes) -> bool:
        """Create only if absent; False when it already existed (nothing written)."""
    def list(self, prefix: str) -> list[tuple[str, int]]:
        """(key, size) of every object under prefix, sorted by key."""
    def stats(self, prefix: str) -> dict[str, tuple[int, str]]:
        """key -> (size, hex md5) of every object under prefix: one listing, not one request per object."""
    def upload_file(self, path: str, key: str, progress: Callable[[int], None]) -> None:
        """Upload a file, reporting bytes as they go; integrity checked by the implementation."""
    def local_path(self, key: str) -> str:
        """A path or URI a job can read this key from (a directory path locally, gs://... in the cloud)."""


def file_md5(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)


class LocalStore:
    def __init__(self, root: str):
        self.root = Path(root).resolve()
        self.uri = str(self.root)

    def _p(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if p != self.root and self.root not in p.parents:
            raise ValueError(f"key escapes the store: {key}")
        return p

    def read(self, key):
        try:
            return self._p(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def _tmp(self, p: Path, data: bytes) -> Path:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{id(data)}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        return tmp

    def write(self, key, data):
        p = self._p(key)
        os.replace(self._tmp(p, data), p)  # readers see the old or the new object, never half of one

    def create(self, key, data):
        p = self._p(key)
        tmp = self._tmp(p, data)
        try:
            os.link(tmp, p)  # atomic create-if-absent of a complete file
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, prefix):
        base = self._p(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        out = []
        if not base.is_dir():
            return out
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.startswith(".") and f.endswith(".tmp"):
                    continue
                full = Path(dirpath) / f
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    out.append((key, full.stat().st_size))
        return sorted(out)

    def stats(self, prefix):
        from .datasync import Md5Cache
        cache = Md5Cache()
        out = {k: (size, cache.md5(self._p(k))) for k, size in self.list(prefix)}
        cache.save()
        return out

    def upload_file(self, path, key, progress):
        p = self._p(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                dst.write(b)
                progress(len(b))
        os.replace(tmp, p)

    def local_path(self, key):
        return str(self._p(key))


def open_store(uri: str) -> BlobStore:
    if uri.startswith("gs://"):
        from .providers.gcp.gcs_store import GcsStore
        return GcsStore(uri)
    return LocalStore(uri)
