"""The store: the control plane every run goes through (DESIGN "The store is the control plane").

A store is a flat key space under a root URI: a GCS bucket (`gs://bucket`, providers/google/gcs_store.py) or a
directory (LocalStore below); `providers.open_store(uri)` opens one through the provider that owns the scheme.
Keys use '/' separators and are built by layout.py. The only consistency primitive is `create`
(create-if-absent: GCS `if_generation_match=0`, locally `O_CREAT|O_EXCL` on a fully written temp file's link),
which is what lets exactly one agent claim a run and keeps log chunks written once; `write_if` (a write
conditional on the object's generation: GCS `ifGenerationMatch`) is what lets several machines share one
changing record, such as the watcher's lease (core/lease.py).
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Protocol

from . import knobs
from .errors import ErrorKind, TpuctlError
from .md5cache import Md5Cache


class BlobStore(Protocol):
    uri: str

    def read(self, key: str) -> bytes | None:
        """The object's bytes, or None when absent."""
    def write(self, key: str, data: bytes) -> None:
        """Create or replace."""
    def create(self, key: str, data: bytes) -> bool:
        """Create only if absent. True when the object now holds `data` because of this call or an earlier try of
        the same write whose answer was lost; False when someone else's object was there (nothing written)."""
    def read_generation(self, key: str) -> tuple[bytes | None, int]:
        """The object's bytes and its generation (a number that changes at every write), or (None, 0) when absent."""
    def write_if(self, key: str, data: bytes, generation: int) -> bool:
        """Write only if the object is still at `generation` (0: only if absent). True when it now holds `data`
        because of this call (or an earlier try of it whose answer was lost); False when someone else wrote
        first (nothing written). `data` must be unique to this write (a holder's id, a nonce): bytes equal to
        another writer's would pass for ours."""
    def delete(self, key: str) -> None:
        """Removes the object; an absent one is not an error (a retried delete whose first try applied)."""
    def free_bytes(self) -> int | None:
        """Room left for writes where the store can tell (a local directory's filesystem), else None."""
    def list(self, prefix: str, limit: int | None = None) -> list[tuple[str, int]]:
        """(key, size) of the objects under prefix in key order: every one, or the first `limit`, read without
        listing the rest (runindex.py relies on it)."""
    def stats(self, prefix: str) -> dict[str, tuple[int, str]]:
        """key -> (size, hex md5) of every object under prefix: one listing, not one request per object."""
    def upload_file(self, path: str, key: str, progress: Callable[[int], None]) -> None:
        """Upload a file, reporting bytes as they go; integrity checked by the implementation."""
    def download_file(self, key: str, path: str, progress: Callable[[int], None]) -> None:
        """Write the object to `path` (atomically: a reader never sees half a file), integrity checked by the
        implementation; reports bytes as they arrive."""
    def copy(self, src: str, dst: str) -> None:
        """dst becomes a copy of src, made by the store itself (no bytes through this machine)."""
    def local_path(self, key: str) -> str:
        """A path or URI a job can read this key from (a directory path locally, gs://... in the cloud)."""


class LocalStore:
    def __init__(self, root: str) -> None:
        self.root = Path(root).resolve()
        self.uri = str(self.root)

    def _p(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if p != self.root and self.root not in p.parents:
            raise ValueError(f"key escapes the store: {key}")
        return p

    def read(self, key: str) -> bytes | None:
        try:
            return self._p(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def read_head(self, key: str, limit: int) -> bytes | None:
        """At most the first `limit` bytes of a regular file (None: absent or not a file): what a run's job wrote
        is read no further than a cap (core/jobfiles.py). A link out of the store is a ValueError (_p); a FIFO or a
        device a job left is never opened for reading (it would block, or never end)."""
        try:
            fd = os.open(self._p(key), os.O_RDONLY | os.O_NONBLOCK)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            chunks, got = [], 0
            while got < limit and (chunk := os.read(fd, min(limit - got, 1 << 20))):
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _tmp(self, p: Path, data: bytes) -> Path:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{id(data)}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
        except BaseException:
            tmp.unlink(missing_ok=True)   # a full disk must not keep the part that was written
            raise
        return tmp

    def write(self, key: str, data: bytes) -> None:
        p = self._p(key)
        os.replace(self._tmp(p, data), p)  # readers see the old or the new object, never half of one

    def create(self, key: str, data: bytes) -> bool:
        p = self._p(key)
        tmp = self._tmp(p, data)
        try:
            os.link(tmp, p)  # atomic create-if-absent of a complete file
            return True
        except FileExistsError:
            return self.read(key) == data   # ours already (the same contract as GcsStore.create)
        finally:
            tmp.unlink(missing_ok=True)

    def _generation(self, p: Path) -> int:
        try:
            return p.stat().st_mtime_ns
        except FileNotFoundError:
            return 0

    @contextmanager
    def _cas_lock(self) -> Iterator[None]:
        """Conditional writes and the reads that pair with them hold one lock file: what a generation check saw is
        what is replaced. The generation is the file's mtime in ns, moved forward on every conditional write even
        within one clock tick (the kernel's file clock is coarse). The lock is taken inside the `try`: a Ctrl-C
        right after flock returned must still close the descriptor, or this process's next flock on the file
        (a watcher giving its lease up on its way out) waits on itself forever."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / _CAS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def read_generation(self, key: str) -> tuple[bytes | None, int]:
        p = self._p(key)
        with self._cas_lock():
            data = self.read(key)
            return (data, self._generation(p)) if data is not None else (None, 0)

    def write_if(self, key: str, data: bytes, generation: int) -> bool:
        p = self._p(key)
        with self._cas_lock():
            now = self._generation(p)
            if now != generation:
                return False
            tmp = self._tmp(p, data)
            stamp = max(time.time_ns(), now + 1)
            os.utime(tmp, ns=(stamp, stamp))
            os.replace(tmp, p)
            return True

    def delete(self, key: str) -> None:
        self._p(key).unlink(missing_ok=True)

    def free_bytes(self) -> int | None:
        try:
            s = os.statvfs(self.root)
        except OSError:
            return None
        return s.f_bavail * s.f_frsize

    def list(self, prefix: str, limit: int | None = None) -> list[tuple[str, int]]:
        parent = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        out: list[tuple[str, int]] = []
        for key, path in self._walk(self._p(parent), f"{parent}/" if parent else "", prefix):
            if limit is not None and len(out) >= limit:
                break
            try:
                out.append((key, path.stat().st_size))
            except FileNotFoundError:
                continue   # removed since the directory was read
        return out

    def _walk(self, d: Path, rel: str, prefix: str) -> Iterator[tuple[str, Path]]:
        """(key, path) of the files under directory `d` (key prefix `rel`) whose keys start with `prefix`, in key
        order, reading directories only as far as the caller iterates: a directory sorts as its name plus "/",
        the character every key inside it continues with."""
        try:
            entries = list(os.scandir(d))
        except (FileNotFoundError, NotADirectoryError):
            return
        named = sorted((e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e) for e in entries)
        for name, e in named:
            key = rel + name
            if name.endswith("/"):
                if key.startswith(prefix) or prefix.startswith(key):
                    yield from self._walk(Path(e.path), key, prefix)
            elif key.startswith(prefix) and not _hidden(e.name) and not (e.is_symlink() and e.is_dir()) \
                    and not (e.is_symlink() and not self._inside(Path(e.path))):
                yield key, Path(e.path)

    def _inside(self, link: Path) -> bool:
        """Whether a link (a job's outputs may hold any) leads to a file inside the store: one that leads out of it,
        or nowhere, is no object of the store (it was listed with its target's size, and `download` failed on it)."""
        try:
            target = link.resolve(strict=True)
        except (OSError, RuntimeError):   # dangling, a loop
            return False
        return self.root in target.parents and target.is_file()

    def stats(self, prefix: str) -> dict[str, tuple[int, str]]:
        cache = Md5Cache()
        out = {k: (size, cache.md5(self._p(k))) for k, size in self.list(prefix)}
        cache.save()
        return out

    def upload_file(self, path: str, key: str, progress: Callable[[int], None]) -> None:
        _copy_file(Path(path), self._p(key), progress)

    def download_file(self, key: str, path: str, progress: Callable[[int], None]) -> None:
        _copy_file(self._p(key), Path(path), progress)

    def copy(self, src: str, dst: str) -> None:
        s, d = self._p(src), self._p(dst)
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = d.with_name(f".{d.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(s, tmp)          # a hard link: instant, no second copy on disk; blobs are never rewritten
        except OSError:
            shutil.copyfile(s, tmp)
        os.replace(tmp, d)

    def local_path(self, key: str) -> str:
        return str(self._p(key))

    def disk_bytes(self) -> int:
        """What the store takes on disk: each file once however many keys link it (a run's data is hard links to
        the blobs, see copy), as `du` counts (issue 40: `ls` showed 992.4 MiB for a store `du` put at 517 MB)."""
        seen: set[tuple[int, int]] = set()
        total = 0
        for _, path in self._walk(self.root, "", ""):
            try:
                s = path.stat()
            except FileNotFoundError:
                continue   # removed since the directory was read
            if (s.st_dev, s.st_ino) not in seen:
                seen.add((s.st_dev, s.st_ino))
                total += s.st_size
        return total



_PARTIAL = ".tpuctl-partial."
_CAS_LOCK = ".tpuctl-cas.lock"
RESERVE = ".tpuctl-reserve"   # room a host agent holds back for records (host/storeguard.py)


def _hidden(name: str) -> bool:
    """Files of the store's own making, never keys: temporaries, partial downloads, the lock file, the reserve."""
    return name.startswith(".") and (name.endswith(".tmp") or name.startswith(_PARTIAL) or name in (_CAS_LOCK,
                                                                                                     RESERVE))


def floor_bytes() -> int:
    """Room a store that can say how much it has keeps for records (TPUCTL_STORE_FLOOR_BYTES, 1 MiB): log chunks
    stop above it, the agent holds it back as a file (host/storeguard.py), and below it the store is full."""
    return knobs.count("TPUCTL_STORE_FLOOR_BYTES", 1 << 20)


def is_full(e: BaseException) -> bool:
    """A write refused for want of room: ENOSPC, or EDQUOT (a quota)."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def full_error(store: BlobStore, e: OSError) -> TpuctlError:
    """A write the store refused for want of room, as one line with the fix (issue 52.7: `submit` said "internal
    error: OSError [Errno 28] ... please report it")."""
    free = store.free_bytes()
    return TpuctlError(ErrorKind.ERROR, f"store full: {store.uri} has {free if free is not None else 'no'} bytes "
                       f"free ({e.strerror or e})", make_room(store.uri))


@contextmanager
def said_full(store: BlobStore) -> Iterator[None]:
    """Writes to `store` inside: one it refuses for want of room is full_error (the store's, not this machine's)."""
    try:
        yield
    except OSError as e:
        if is_full(e):
            raise full_error(store, e) from None
        raise


def make_room(uri: str) -> str:
    return (f"make room where the store lives ({uri}): delete what old runs left under runs/*/output there (`tpuctl "
            "download RUN` first keeps a copy), or give it more space; then run the command again")


def partial_name() -> str:
    """A file being written, beside where it lands. Not derived from the final name: TensorBoard reads any file
    whose name holds "tfevents", half-written ones included."""
    return f"{_PARTIAL}{os.getpid()}.{secrets.token_hex(6)}"


def is_partial(name: str) -> bool:
    """Whether a file's name is partial_name()'s: a fetch that has not finished (or was stopped)."""
    return name.startswith(_PARTIAL)


def _copy_file(src: Path, dst: Path, progress: Callable[[int], None]) -> None:
    """Copy through a temporary file beside dst, then rename: dst is the old file or the whole new one."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(partial_name())
    try:
        with open(src, "rb") as f, open(tmp, "wb") as out:
            while b := f.read(1 << 20):
                out.write(b)
                progress(len(b))   # may raise to stop the copy (an interrupted submit)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
