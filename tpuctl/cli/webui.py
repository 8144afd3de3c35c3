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
def ui(port: Optional[int] = typer.Option(None, "--port", help="Port to listen on (default: a free one)."),
       no_browser: bool = typer.Option(False, "--no-browser", help="Print the URL; open no browser."),
       metrics_only: bool = typer.Option(False, "--metrics-only", help="Serve /metrics alone (for Prometheus), no "
                                         "pages; opens no browser."),
       token_file: Optional[str] = typer.Option(None, "--token-file", metavar="PATH", help="Write the token to PATH "
                                                "(mode 0600) for Prometheus's credentials_file, not into the URL."),
       bind_addr: str = typer.Option("127.0.0.1", "--bind", metavar="ADDR", help="Listen on ADDR (e.g. 0.0.0.0 "
                                     "for a Prometheus on another machine): anyone who reaches it and has the token "
                                     "reads every run."),
       grafana_dashboard: bool = typer.Option(False, "--grafana-dashboard", help="Print the Grafana dashboard "
                                              "(JSON) for /metrics, and serve nothing.")) -> None:
    """Serve a page of every cluster, its runs, their loss curves, logs and TPU utilisation, and /metrics for
    Prometheus, on 127.0.0.1 with a token; read-only. Ctrl-C stops it."""
    if grafana_dashboard:
        from ..ui import dashboard
        print(dashboard.text(), end="")
        return
    missing = [m for m in ("starlette", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
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
        con.err.print(f"tpuctl ui: {'/metrics' if metrics_only else 'read-only pages'} of every cluster here"
                      + (f", on {bind_addr}: the token is needed" if bind_addr != "127.0.0.1" else "")
                      + (f"; the token is in {token_file}" if token_file else "") + "; Ctrl-C stops it",
                      style="dim", markup=False)
        if not no_browser and not metrics_only:
            import webbrowser
            opened.append(openfile.write(url))   # the browser's command line names this file, not the token
            webbrowser.open(opened[0].as_uri())
    try:
        server.serve(port, ready, bind_addr, metrics_only, token_file)
    except KeyboardInterrupt:
        raise interrupted("tpuctl ui stopped") from None
    finally:
        for path in opened:
            openfile.remove(path)
