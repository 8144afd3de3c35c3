"""What `tpuctl download` wrote, recognised wherever it landed, so that no `submit` packs it (issue 52).

`download` writes a run's outputs into `./RUN_ID/`, and the natural place to run it is the job directory: without
this, the next `submit` packed those outputs as code (a checkpoint directory: gigabytes on every submit, and the
job found its old outputs in its working directory). So each download records the files it wrote in a marker
beside them (MARKER, in the destination directory), and packaging leaves out every file a marker lists, and the
marker itself. A marker lists files, not its directory: `download -o .` in the job directory leaves the job's own
files packed. A marker that cannot be read lists nothing (it is written whole, by rename, so only a hand can
break it)."""
from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Any, Iterable

from .store import is_partial

MARKER = ".tpuctl-downloaded.json"


def listed(directory: Path) -> set[str]:
    """The files (paths relative to `directory`, with /) that downloads into `directory` wrote."""
    try:
        doc = json.loads((directory / MARKER).read_bytes())
        return {str(f) for f in doc.get("files", []) if isinstance(f, str)}
    except (OSError, ValueError, AttributeError):
        return set()


def written(rel: str, names: set[str]) -> bool:
    """Whether the file at `rel` (relative to a directory whose marker lists `names`) is a download's: listed, the
    marker or its temporary, or a fetch that was stopped half way (store.partial_name, beside its target)."""
    name = rel.rsplit("/", 1)[-1]
    return rel in names or name.startswith(MARKER) or is_partial(name)


def record(directory: Path, run_id: str, files: Iterable[str]) -> None:
    """Add `files` (relative to `directory`) of run `run_id` to the directory's marker; written before the files
    themselves, so that a download stopped half way is recognised too. Rewritten only when something is new, under
    a lock: two downloads into one directory at once (two runs, or `download` beside a `tensorboard` sync) each
    add theirs, and neither's list is lost."""
    files = set(files)
    if files <= listed(directory):
        return
    directory.mkdir(parents=True, exist_ok=True)
    lock = os.open(directory, os.O_RDONLY)   # the directory itself is locked: no lock file is left beside the outputs
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)   # released when it is closed
        doc: dict[str, Any] = {}
        try:
            doc = json.loads((directory / MARKER).read_bytes())
        except (OSError, ValueError):
            pass
        doc = doc if isinstance(doc, dict) else {}
        doc = {"about": "files `tpuctl download` wrote here: `tpuctl submit` never packs them",
               "runs": sorted({str(r) for r in doc.get("runs", []) if isinstance(r, str)} | {run_id}),
               "files": sorted(listed(directory) | files)}
        tmp = directory / f"{MARKER}.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, directory / MARKER)
    finally:
        os.close(lock)
