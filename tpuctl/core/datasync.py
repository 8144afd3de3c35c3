"""A run's data: each file's content uploaded once as a blob (tpuctl/blobs/<md5>), then copied into the run's own
directory (runs/<id>/data/<path>) by the store itself (a server-side copy on GCS, a hard link locally). So a run
sees exactly what was submitted with it: a later submit that changes or removes a file never touches an earlier
run's view, and unchanged content is never sent twice (local md5s are cached, md5cache.py)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from . import layout
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


def contents(files: list[tuple[Path, str]]) -> dict[str, tuple[Path, int, list[str]]]:
    """md5 -> (a local file with that content, its size, every data path that holds it)."""
    cache = Md5Cache()
    by_md5: dict[str, tuple[Path, int, list[str]]] = {}
    for path, rel in files:
        md5 = cache.md5(path)
        by_md5.setdefault(md5, (path, path.stat().st_size, []))[2].append(rel)
    cache.save()
    return by_md5


def stored(store: BlobStore) -> set[str]:
    """The md5s whose blobs the store holds: one listing."""
    return {k[len(layout.BLOBS_PREFIX):] for k in store.stats(layout.BLOBS_PREFIX)}


def sync(store: BlobStore, paths: list[Path], names: list[str], run_id: str, transfer: Transfer) -> dict[str, int]:
    """Upload the blobs the store lacks and give the run its copies, pipelined per content (a copy follows its
    blob's upload at once); returns counts and bytes sent/skipped."""
    files = plan(paths, names)
    by_md5 = contents(files)
    have = stored(store)
    missing = [md5 for md5 in by_md5 if md5 not in have]
    sent = sum(by_md5[md5][1] for md5 in missing)
    advance = transfer(sent) if missing else (lambda n: None)

    def one(md5: str) -> None:
        path, _, rels = by_md5[md5]
        if md5 not in have:
            store.upload_file(str(path), layout.blob(md5), advance)
        for rel in rels:
            store.copy(layout.blob(md5), layout.run_data(run_id) + rel)
    if by_md5:
        with ThreadPoolExecutor(min(WORKERS, len(by_md5))) as pool:
            for f in [pool.submit(one, md5) for md5 in by_md5]:
                f.result()
    skipped = sum(size * len(rels) for md5, (_, size, rels) in by_md5.items() if md5 in have)
    return {"files": len(files), "uploaded": len(missing), "bytes_sent": sent, "bytes_skipped": skipped}
