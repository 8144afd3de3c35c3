"""`tpuctl download`: a run's outputs (runs/<id>/output/) from the store into a local directory, in parallel and
incrementally: a file already there with the object's size and md5 is not fetched again, so running it again
while a job trains fetches only what changed (new checkpoints, grown event files)."""
from __future__ import annotations

import os
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from ..core import downloaded, layout, umask
from ..core.datasync import WORKERS, Transfer
from ..core.errors import ErrorKind, TpuctlError
from ..core.md5cache import Md5Cache
from ..core.store import BlobStore, partial_name


@dataclass
class Fetched:
    files: int            # objects under the run's outputs
    fetched: int          # of them, fetched by this call
    bytes_fetched: int
    bytes_unchanged: int


def _place(dest: Path, rel: str) -> Path:
    """Where an object lands under dest; an object name that climbs out (`../x`, `/x`: legal in GCS) is refused."""
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or ".." in parts:
        raise TpuctlError(ErrorKind.INPUT, f"refusing to download {rel!r}: the name leaves the destination",
                          "someone wrote an odd object name into the run's outputs; fetch the rest by hand")
    return dest.joinpath(*parts)


def _grow(store: BlobStore, key: str, target: Path, advance: Callable[[int], None]) -> None:
    """Fetch a file that may have grown, into the same file: when what is here is the start of the new content,
    only the rest is appended, so a reader holding it open (TensorBoard tails event files by offset and never
    reopens them) sees the new records; otherwise it is replaced."""
    if not target.is_file():
        return store.download_file(key, str(target), advance)
    part = target.with_name(partial_name())
    try:
        store.download_file(key, str(part), advance)
        have = target.stat().st_size
        with open(part, "rb") as new, open(target, "r+b") as old:
            if new.read(have) == old.read(have):
                old.seek(have)
                shutil.copyfileobj(new, old, 1 << 20)
                return None
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    return None


def _give_mode(store: BlobStore, key: str, target: Path) -> None:
    """A fetched file gets the mode the user's umask gives a new file, executable where the store's own file is (a
    local store; a bucket keeps no modes), never tpuctl's private 0600: the outputs are the user's (issue 63.6)."""
    executable = False
    where = store.local_path(key)
    if "://" not in where:
        try:
            executable = bool(os.stat(where).st_mode & stat.S_IXUSR)
        except OSError:
            pass
    try:
        os.chmod(target, umask.user_file_mode(executable))
    except OSError:
        pass   # a file system without modes: what it gave stays


def _new_dirs(dest: Path, targets: list[Path]) -> list[Path]:
    """The folders a download is about to make (dest, those above it, and those under it its files land in)."""
    dirs = {dest, *dest.absolute().parents} | {p for t in targets for p in t.parents if dest in p.parents}
    return sorted((d for d in dirs if not d.exists()), key=lambda d: len(d.parts))


def outputs(store: BlobStore, run_id: str, dest: Path, transfer: Transfer,
            want: Callable[[str], bool] = lambda rel: True, in_place: bool = False) -> Fetched:
    """Fetch the run's output files whose path (relative to the output directory) `want` accepts. `in_place`:
    a grown file is appended to rather than replaced (_grow)."""
    prefix = layout.run_output(run_id) + "/"
    remote = {k: v for k, v in store.stats(prefix).items() if want(k[len(prefix):])}
    cache = Md5Cache()
    todo: list[tuple[str, Path, int]] = []
    unchanged = 0
    for key, (size, md5) in sorted(remote.items()):
        target = _place(dest, key[len(prefix):])
        if target.is_file() and target.stat().st_size == size and md5 and cache.md5(target) == md5:
            unchanged += size
            continue
        todo.append((key, target, size))
    cache.save()
    made = _new_dirs(dest, [t for _, t, _ in todo])
    # before anything is fetched: a download stopped half way is still never packed by a `submit` (downloaded.py)
    if remote:
        downloaded.record(dest, run_id, [key[len(prefix):] for key in remote])
    total = sum(size for _, _, size in todo)
    advance = transfer(total) if todo else (lambda n: None)
    if todo:
        with ThreadPoolExecutor(min(WORKERS, len(todo))) as pool:
            fetch = (lambda k, t: _grow(store, k, t, advance)) if in_place else \
                (lambda k, t: store.download_file(k, str(t), advance))
            for f in [pool.submit(fetch, key, target) for key, target, _ in todo]:
                f.result()
        for key, target, _ in todo:
            _give_mode(store, key, target)
    for d in made:
        if d.is_dir():
            os.chmod(d, umask.user_file_mode(executable=True))
    return Fetched(len(remote), len(todo), total, unchanged)
