"""`tpuctl ui`: every cluster, run, loss curve, log and chip utilisation in a browser (tpuctl/ui). Its server and
pages load only when the command runs (`tpuctl --help` imports none of them)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

import typer

from .common import app, console, interrupted
from ..core.errors import ErrorKind, TpuctlError

EXTRA = "pip install 'tpuctl[ui]'"


@app.command()
def ui(port: Optional[int] = typer.Option(None, "--port", help="Port on 127.0.0.1 (default: a free one)."),
       no_browser: bool = typer.Option(False, "--no-browser", help="Print the URL; open no browser.")) -> None:
    """Serve a page of every cluster, its runs, their loss curves, logs and TPU utilisation, on 127.0.0.1 with a
    token; read-only. Ctrl-C stops it."""
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise TpuctlError(ErrorKind.INPUT, f"tpuctl ui needs {' and '.join(missing)}, not installed", EXTRA)
    if port is not None and not 1 <= port <= 65535:
        raise TpuctlError(ErrorKind.INPUT, f"--port {port} is not a port", "ports run from 1 to 65535; leave --port "
                          "out for a free one")
    from ..ui import openfile, server
    con = console()
    opened: list[Path] = []

    def ready(url: str) -> None:
        print(url, flush=True)   # the user's own terminal: the one place the token is shown
        con.err.print("tpuctl ui: read-only pages of every cluster here; Ctrl-C stops it", style="dim", markup=False)
        if not no_browser:
            import webbrowser
            opened.append(openfile.write(url))   # the browser's command line names this file, not the token
            webbrowser.open(opened[0].as_uri())
    try:
        server.serve(port, ready)
    except KeyboardInterrupt:
        raise interrupted("tpuctl ui stopped") from None
    finally:
        for path in opened:
            openfile.remove(path)
