"""Files the job reads and writes, local or gs://, without TensorFlow where it is not the backend.

Local paths go through the standard library. A gs:// path inside the cluster's store ($TPUCTL_STORE, which tpuctl
sets for every job) goes through tpuctl's own store client (google-cloud-storage, in tpuctl's dependencies); any
other gs:// path through TensorFlow's tf.io.gfile, which needs TensorFlow installed.
"""
from __future__ import annotations

import fnmatch
import glob as _glob
import os
import shutil
import tempfile


def remote(path: str) -> bool:
    return "://" in path


def _in_store(path: str):
    """(store, key) when `path` lies in the cluster's store, else None."""
    store = os.environ.get("TPUCTL_STORE", "").rstrip("/")
    if remote(path) and store and path.startswith(store + "/"):
        from tpuctl.providers.stores import open_store
        return open_store(store), path[len(store) + 1:]
    return None


def _gfile():
    import tensorflow as tf
    return tf.io.gfile


def makedirs(path: str) -> None:
    if not remote(path):
        os.makedirs(path, exist_ok=True)
    elif not _in_store(path):
        _gfile().makedirs(path)   # a store has no directories: nothing to make


def exists(path: str) -> bool:
    if not remote(path):
        return os.path.exists(path)
    s = _in_store(path)
    if s:
        found = s[0].list(s[1], limit=1)   # key order: the key itself comes before any longer key it prefixes
        return bool(found) and found[0][0] == s[1]
    return _gfile().exists(path)


def read(path: str) -> bytes:
    if not remote(path):
        with open(path, "rb") as f:
            return f.read()
    s = _in_store(path)
    if s:
        data = s[0].read(s[1])
        if data is None:
            raise FileNotFoundError(path)
        return data
    with _gfile().GFile(path, "rb") as f:
        return f.read()


def write(path: str, data: bytes) -> None:
    """Whole or not at all: a local file is replaced by rename, an object by one upload."""
    if not remote(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return
    s = _in_store(path)
    if s:
        s[0].write(s[1], data)
        return
    with _gfile().GFile(path, "wb") as f:
        f.write(data)


def copy(src: str, dst: str) -> None:
    """Whole or not at all, as write(): a reader (a resumed run looking for its latest checkpoint) never finds
    half a file."""
    if not remote(src) and not remote(dst):
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        tmp = f"{dst}.tmp{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    else:
        write(dst, read(src))


def glob(pattern: str) -> list[str]:
    """Sorted paths matching `pattern` (a wildcard in the last part only, for gs://)."""
    if not remote(pattern):
        return sorted(_glob.glob(pattern))
    s = _in_store(pattern)
    if s:
        store, key = s
        prefix = key.split("*", 1)[0].split("?", 1)[0]
        base = pattern[:len(pattern) - len(key)]
        return sorted(base + k for k, _ in store.list(prefix) if fnmatch.fnmatchcase(k, key))
    return sorted(_gfile().glob(pattern))


def remove(path: str) -> None:
    if not remote(path):
        if os.path.exists(path):
            os.remove(path)
        return
    s = _in_store(path)
    if s:
        s[0].delete(s[1])
    elif _gfile().exists(path):
        _gfile().remove(path)


def local_copy(path: str) -> str:
    """A local file holding `path`'s bytes: `path` itself when local, else a download into a temporary file."""
    if not remote(path):
        return path
    fd, local = tempfile.mkstemp(suffix=os.path.basename(path))
    with os.fdopen(fd, "wb") as f:
        f.write(read(path))
    return local
