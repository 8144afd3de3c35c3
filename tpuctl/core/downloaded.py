"""What `tpuctl download` wrote, recognised wherever it landed, so that no `submit` packs it (issue 52).

`download` writes a run's outputs into `./RUN_ID/`, and the natural place to run it is the job directory: without
this, the next `submit` packed those outputs as code (a checkpoint directory: gigabytes on every submit, and the
job found its old outputs in its working directory). So each download records the files it wrote in a marker
beside them (MARKER, in the destination directory), and packaging leaves out every file a marker lists, and the
marker itself. A marker lists files, not its directory: `download -o .` in the job directory leaves the job's own
files packed. A marker that cannot be read lists nothing (it is written whole, by rename, so only a hand can
break it)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

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
    themselves, so that a download stopped half way is recognised too. Rewritten only when something is new."""
    have = listed(directory)
    new = set(files) - have
    if not new and (directory / MARKER).is_file():
        return
    runs: list[str] = []
    try:
        runs = [str(r) for r in json.loads((directory / MARKER).read_bytes()).get("runs", [])]
    except (OSError, ValueError, AttributeError):
        pass
    doc = {"about": "files `tpuctl download` wrote here: `tpuctl submit` never packs them",
           "runs": sorted(set(runs) | {run_id}), "files": sorted(have | new)}
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, directory / MARKER)
