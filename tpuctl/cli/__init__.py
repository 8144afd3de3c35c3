"""The command line: the typer app, its commands and what they print (`tpuctl = tpuctl.cli:main`).

`main` loads the commands (typer, rich and tpuctl's own modules: the first ~0.2 s of every command). For the
`tpuctl` command a Ctrl-C until then is answered by tpuctl/__init__.py's guard (one line, exit 130, at once: issue
52.7, where this module's own imports and a finalizer still let a traceback or a lost press through), which
cli/entry.py's main lifts once the commands are loaded; imported otherwise (a test, `python -c`), the import
below is guarded here, as before (issue 40). `app` is loaded when asked for."""
from __future__ import annotations

import sys
from typing import Any, List, Optional

__all__ = ["app", "main"]


def main(argv: Optional[List[str]] = None) -> None:
    try:
        from .entry import main as run
    except KeyboardInterrupt:
        sys.stderr.write("\nerror: interrupted while tpuctl was starting; nothing was done\n")
        sys.exit(130)   # ExitCode.INTERRUPTED, written out: not even core.errors is loaded yet
    run(argv)


def __getattr__(name: str) -> Any:
    if name == "app":
        from .common import app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
