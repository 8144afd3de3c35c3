"""Job packages: a deterministic tar.gz of the job directory, addressed by its sha256, and a safe unpack.

Deterministic (sorted names, zeroed times and owners, normalised modes, gzip mtime 0) so unchanged code has the
same hash and is never uploaded twice.
"""
from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

from typing import Sequence

from .errors import ErrorKind, TpuctlError

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


def files(root: Path, exclude_paths: Sequence[Path] = ()) -> list[str]:
    patterns = ALWAYS_EXCLUDED + _ignore_patterns(root)
    skip = {p.resolve() for p in exclude_paths}
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = sorted(n for n in dirnames if not _excluded((d / n).relative_to(root).as_posix(), patterns)
                             and (d / n).resolve() not in skip)
        for n in sorted(filenames):
            rel = (d / n).relative_to(root).as_posix()
            if not _excluded(rel, patterns) and (d / n).resolve() not in skip:
                out.append(rel)
    return sorted(out)


def build(root: Path, exclude_paths: Sequence[Path] = ()) -> tuple[bytes, str]:
    """(tar.gz bytes, sha256 hex) of the job directory minus excluded and synced-data paths."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
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
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as g:
        g.write(raw.getvalue())
    data = gz.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def unpack(data: bytes, dest: Path) -> None:
    """Unpack, refusing absolute paths, '..', devices, and links that leave dest."""
    dest = Path(dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        for m in members:
            target = (dest / m.name).resolve()
            if m.name.startswith("/") or ".." in Path(m.name).parts or (target != dest and dest not in target.parents):
                raise TpuctlError(ErrorKind.INPUT, f"unsafe path in job package: {m.name}", "rebuild the package")
            if not (m.isfile() or m.isdir() or m.issym()):
                raise TpuctlError(ErrorKind.INPUT, f"unsupported entry in job package: {m.name}", "only files and links")
            if m.issym():
                link = (target.parent / m.linkname).resolve()
                if m.linkname.startswith("/") or (link != dest and dest not in link.parents):
                    raise TpuctlError(ErrorKind.INPUT, f"link leaves the job directory: {m.name} -> {m.linkname}",
                                      "remove the link from the job directory")
        for m in members:
            if m.isdir():
                (dest / m.name).mkdir(parents=True, exist_ok=True)
            elif m.isfile():
                p = dest / m.name
                p.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                assert src is not None, "a regular file member always has data"
                with src, open(p, "wb") as out:
                    out.write(src.read())
                os.chmod(p, m.mode & 0o777)
            else:
                p = dest / m.name
                p.parent.mkdir(parents=True, exist_ok=True)
                if p.is_symlink() or p.exists():
                    p.unlink()
                os.symlink(m.linkname, p)
