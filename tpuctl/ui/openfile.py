"""What `tpuctl ui` hands the browser: not its URL, whose token any local user would read in the browser's command
line (/proc/PID/cmdline), but a file only the user can read that redirects to it, as Jupyter does
(jupyter_server/serverapp.py: `jpserver-<pid>-open.html` in its runtime directory, opened as a file: URL, its
template a `<meta http-equiv="refresh">` to the URL with the token and a link for a browser that does not follow
it). Removed when `tpuctl ui` ends."""
from __future__ import annotations

import html
import os
from pathlib import Path

from ..core import state


def write(url: str) -> Path:
    """The file (mode 0600, in a directory of mode 0700 under TPUCTL_HOME) that sends a browser to `url`."""
    where = state.home() / "ui"
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(where, 0o700)
    path = where / f"open-{os.getpid()}.html"
    path.unlink(missing_ok=True)   # one a process of the same pid left (O_EXCL below: never a file planted there)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    u = html.escape(url)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
                f'<meta http-equiv="refresh" content="0;url={u}"><title>tpuctl ui</title></head>'
                f'<body><p>Opening <a href="{u}">tpuctl ui</a>.</p></body></html>\n')
    return path


def remove(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)
