"""A Kaggle session's output into the run's output directory: the job's files (each confined to that directory:
the names are the job's own), the marks the session script leaves (continue, exit code)."""
from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Callable

from ...core.errors import ErrorKind, TpuctlError
from . import kernel
from .blobs import fetch


def fetch_output(files: list[tuple[str, str]], out: Path,
                 refused: Callable[[str], None]) -> tuple[set[str], int | None, bool]:
    """A session's output (name, url) into the run's output directory `out`: (the marks it left, the job's exit code
    when it left one, whether any output file changed: a checkpoint to resume from); `refused` is told why of each
    file not downloaded (confined)."""
    marks: set[str] = set()
    exit_code, progressed = None, False
    for name, url in files:
        if name in (kernel.CONTINUE_MARK, kernel.EXIT_MARK):
            marks.add(name)
            if name == kernel.EXIT_MARK:
                tmp = out.parent / f".{kernel.EXIT_MARK}"
                fetch(url, tmp)
                exit_code = int(tmp.read_text() or 1)
                tmp.unlink()
        elif name.startswith(kernel.OUTPUT + "/"):
            try:
                dest = confined(out, name[len(kernel.OUTPUT) + 1:], name)
            except TpuctlError as e:
                refused(e.message)
                continue
            before = dest.read_bytes() if dest.is_file() else None
            fetch(url, dest)
            progressed = progressed or dest.read_bytes() != before
    return marks, exit_code, progressed


def confined(out: Path, rel: str, name: str) -> Path:
    """Where output file `rel` goes under `out`: a name Kaggle lists that would land outside it (absolute, or with
    `..`) is refused with the name. A session's names are the job's own files, which it could name at will, and
    nothing the API documents says the names are checked (ApiKernelSessionOutputFile.file_name is a plain string)."""
    parts = PurePosixPath(rel).parts
    if not rel or rel.startswith("/") or ".." in parts or "\\" in rel:
        raise TpuctlError(ErrorKind.REFUSED, f"Kaggle's output of the session names {name!r}, outside the run's "
                          "output directory: not downloaded", "the job should write under its output directory only")
    dest = out / rel
    if not dest.resolve().is_relative_to(out.resolve()):   # a link already there that points out
        raise TpuctlError(ErrorKind.REFUSED, f"output file {name!r} would be written outside {out}", "")
    return dest
