"""Job packages: a deterministic tar.gz of the job directory, addressed by its sha256, and a safe unpack.

Deterministic (sorted names, zeroed times and owners, normalised modes, gzip mtime 0) so unchanged code has the
same hash and is never uploaded twice.
"""
from __future__ import annotations

import errno
import fnmatch
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Sequence

from . import downloaded
from .errors import ErrorKind, TpuctlError, bad_input

ALWAYS_EXCLUDED = [".git", ".hg", ".svn", "__pycache__", "*.pyc", ".venv", "venv", ".ipynb_checkpoints",
                   ".DS_Store", ".pytest_cache", ".tpuctl-cache"]


def _ignore_patterns(root: Path) -> list[str]:
    f = root / ".tpuctlignore"
    if not f.is_file():
        return []
    return [line.strip().rstrip("/") for line in f.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def _excluded(rel: str, patterns: list[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p) for p in patterns)


@dataclass
class LeftOut:
    """Files of the job directory a `tpuctl download` wrote (core/downloaded.py): never packed."""
    directory: str          # relative to the job directory ("." for the job directory itself)
    files: int
    bytes: int


def files(root: Path, exclude_paths: Sequence[Path] = ()) -> list[str]:
    """The job's entries, relative to root: files, and links as links (a linked directory is not descended: the
    link is packed and what it points to is packed where it lives). A link that resolves outside the job directory
    is refused, never silently dropped: the host would not have what it points to. What `tpuctl download` wrote is
    left out (`left_out` says what)."""
    return _walk(root, exclude_paths)[0]


def left_out(root: Path, exclude_paths: Sequence[Path] = ()) -> list[LeftOut]:
    """What `files` leaves out because `tpuctl download` wrote it, by directory; what the job's .tpuctlignore (or
    ALWAYS_EXCLUDED) leaves out anyway is not counted: the user has said so already."""
    return _walk(root, exclude_paths)[1]


def _walk(root: Path, exclude_paths: Sequence[Path]) -> tuple[list[str], list[LeftOut]]:
    root = Path(os.path.realpath(root))
    patterns = ALWAYS_EXCLUDED + _ignore_patterns(root)
    skip = {Path(os.path.realpath(p)) for p in exclude_paths}
    out = []
    fetched: dict[str, LeftOut] = {}
    marked: list[tuple[Path, set[str]]] = []    # directories holding a download marker, and the files it lists
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if downloaded.MARKER in filenames:
            marked.append((d, downloaded.listed(d)))
        links = [n for n in dirnames if (d / n).is_symlink()]
        dirnames[:] = sorted(n for n in dirnames if n not in links and (d / n).resolve() not in skip
                             and not _excluded((d / n).relative_to(root).as_posix(), patterns))
        for n in sorted(filenames + links):
            rel = (d / n).relative_to(root).as_posix()
            if _excluded(rel, patterns) or _real(d / n, rel) in skip:
                continue
            by = _downloaded(d / n, marked)
            if by is not None:
                where = by.relative_to(root).as_posix()
                got = fetched.setdefault(where, LeftOut(where, 0, 0))
                if not n.startswith(downloaded.MARKER):   # the outputs are counted, not tpuctl's own note of them
                    got.files += 1
                    got.bytes += 0 if (d / n).is_symlink() else (d / n).stat().st_size
                continue
            if (d / n).is_symlink():
                target = os.path.realpath(d / n)
                if target != str(root) and not target.startswith(str(root) + os.sep):
                    raise bad_input(f"{rel} links to {target}, outside the job directory",
                                    "copy what it points to into the job, or list it under `data` in tpuctl.toml")
            out.append(rel)
    return sorted(out), [fetched[k] for k in sorted(fetched)]


def _downloaded(path: Path, marked: list[tuple[Path, set[str]]]) -> Path | None:
    """The marked directory whose download wrote `path`, or None. os.walk goes top-down, so every marker above
    `path` is known by the time `path` is reached."""
    for d, names in marked:
        if d in path.parents and downloaded.written(path.relative_to(d).as_posix(), names):
            return d
    return None


def size(root: Path, exclude_paths: Sequence[Path] = ()) -> int:
    """Bytes the package will hold (before compression)."""
    return sum((root / rel).stat().st_size for rel in files(root, exclude_paths) if not (root / rel).is_symlink())


def build_file(root: Path, exclude_paths: Sequence[Path], dest: Path) -> str:
    """Write the package (tar.gz) to `dest`, streaming file by file; returns its sha256."""
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel in files(root, exclude_paths):
            path = root / rel
            info = tar.gettarinfo(str(path), arcname=rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isfile():
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            elif info.issym():
                tar.addfile(info)
    h = hashlib.sha256()
    with open(dest, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def build(root: Path, exclude_paths: Sequence[Path] = ()) -> tuple[bytes, str]:
    """(tar.gz bytes, sha256 hex) of the job directory minus excluded and synced-data paths (small jobs, tests)."""
    with tempfile.TemporaryDirectory() as tmp:
        sha = build_file(root, exclude_paths, Path(tmp) / "job.tar.gz")
        return (Path(tmp) / "job.tar.gz").read_bytes(), sha


MAX_BYTES = 10 << 30        # unpacked size of one job package (TPUCTL_MAX_PACKAGE_BYTES, or the cluster record)
MAX_ENTRIES = 200_000       # entries in one job package (TPUCTL_MAX_PACKAGE_ENTRIES, or the cluster record)


def _real(path: Path, rel: str) -> Path:
    """Where `path` leads; a link loop (`a -> b`, `b -> a`) leads nowhere and is refused."""
    real = os.path.realpath(path)   # never raises: a loop comes back as a path that is still a link
    if os.path.islink(real):
        raise TpuctlError(ErrorKind.INPUT, f"unsafe job package: {rel} is a link loop",
                          "remove the link, or point it at a file inside the job")
    return Path(real)


def _refuse(message: str) -> TpuctlError:
    return TpuctlError(ErrorKind.INPUT, f"unsafe job package: {message}", "rebuild the package with `tpuctl submit`")


def _inside(dest: str, path: str, what: str) -> str:
    if os.path.islink(path):
        raise _refuse(f"{what} goes through a link loop")   # realpath gave up on it: `a -> b`, `b -> a`
    if path != dest and not path.startswith(dest + os.sep):
        raise _refuse(f"{what} leaves the run directory")
    return path


def unpack(data: bytes, dest: Path, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES) -> None:
    """Unpack entry by entry (streamed), checking each against the disk as it is at that moment: a link made by an
    earlier entry is followed when the next entry's place is resolved, so a chain such as `a -> .`, `a/b -> ..`,
    `b/x` cannot climb out. Refused: absolute names, `..`, devices and other special entries, links that resolve
    outside `dest` or loop, more than `max_entries` entries or `max_bytes` unpacked."""
    try:
        _unpack(data, dest, max_bytes, max_entries)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EEXIST, errno.ENOTDIR):
            raise   # the disk's own trouble (full, read-only): not the package's
        # an entry placed through a link loop, or over a file a later entry treats as a directory
        raise _refuse(f"{e.filename or 'an entry'} cannot be placed ({e.strerror})") from e


def _unpack(data: bytes, dest: Path, max_bytes: int, max_entries: int) -> None:
    root = os.path.realpath(dest)
    os.makedirs(root, exist_ok=True)
    total = entries = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as tar:
        for m in tar:
            entries += 1
            if entries > max_entries:
                raise _refuse(f"more than {max_entries} entries")
            name = PurePosixPath(m.name)
            if m.name.startswith("/") or ".." in name.parts or not name.parts:
                raise _refuse(f"path {m.name!r}")
            if not (m.isfile() or m.isdir() or m.issym()):
                raise _refuse(f"{m.name!r} is not a file, directory or link")
            parent = _inside(root, os.path.realpath(os.path.join(root, *name.parent.parts)), m.name)
            target = os.path.join(parent, name.name)
            if m.isdir():
                _inside(root, os.path.realpath(target), m.name)
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(parent, exist_ok=True)
            if os.path.islink(target) or os.path.isfile(target):
                os.unlink(target)   # an entry replaces what is there; never write through a link
            if m.issym():
                if m.linkname.startswith("/"):
                    raise _refuse(f"link {m.name!r} -> {m.linkname!r}")
                _inside(root, os.path.realpath(os.path.join(parent, m.linkname)), f"link {m.name!r} -> {m.linkname!r}")
                os.symlink(m.linkname, target)
                continue
            total += m.size
            if total > max_bytes:
                raise _refuse(f"more than {max_bytes} bytes unpacked")
            src = tar.extractfile(m)
            assert src is not None, "a regular file member always has data"
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, m.mode & 0o777 | 0o600)
            with src, os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
