"""`tpuctl ui`'s web server: Starlette routes over views.py and runview.py, served by uvicorn on 127.0.0.1 only.

Every page is one small HTML document that carries its own data (so the first byte already holds what the page
shows) and app.js, which draws it and then asks the same data again every TPUCTL_UI_POLL_SECONDS (2 s) under
/api/ (the log: only the chunks after the last one it has). Every request must carry the token, in the query
(`?token=`, as the printed URL has it) or in the cookie the first such request sets, as Jupyter does; anything else
is answered 403; `Authorization: Bearer <token>` is taken too (how Prometheus scrapes /metrics: metrics.py). Only GET
and HEAD exist: no page changes anything."""
from __future__ import annotations

import functools
import html
import json
import secrets
import socket
import time
from importlib import resources
from typing import Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..core import knobs
from ..core.errors import ErrorKind, TpuctlError
from . import metrics, runview, tokenfile, views
from .figures import Figures, store_wait

COOKIE = "tpuctl_ui_token"


def poll_seconds() -> float:
    return knobs.number("TPUCTL_UI_POLL_SECONDS", 2)


class TokenRequired(BaseHTTPMiddleware):
    def __init__(self, app: Any, token: str) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        given = request.query_params.get("token")
        bearer = metrics.bearer(request.headers.get("authorization"))   # Prometheus's credentials_file
        ok = any(t and secrets.compare_digest(t, self.token) for t in (given, request.cookies.get(COOKIE), bearer))
        if not ok:
            return Response("403: this page needs the token `tpuctl ui` printed (open the URL it printed)\n",
                            status_code=403, media_type="text/plain")
        if request.method not in ("GET", "HEAD"):
            return Response("405: tpuctl ui only reads\n", status_code=405, media_type="text/plain")
        response = await call_next(request)
        if given:
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
        response.headers["Cache-Control"] = "no-store"
        return response


def _page(view: str, title: str, data: dict[str, Any], **attrs: str) -> HTMLResponse:
    payload = json.dumps(data, default=str).replace("</", "<\\/")
    extra = "".join(f' data-{k}="{html.escape(v)}"' for k, v in attrs.items())
    return HTMLResponse(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} - tpuctl</title>
<link rel="stylesheet" href="/static/uPlot.min.css"><link rel="stylesheet" href="/static/app.css">
</head><body>
<nav><a href="/">Clusters</a> <a href="/runs">Runs</a> <a href="/leftovers">Leftovers</a></nav>
<main id="app" data-view="{view}" data-poll="{poll_seconds():g}"{extra}><h1>{html.escape(title)}</h1></main>
<script id="data" type="application/json">{payload}</script>
<script src="/static/uPlot.iife.min.js"></script><script src="/static/app.js"></script>
</body></html>""")


class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=str, separators=(",", ":")).encode()


def _problem(e: TpuctlError) -> Response:
    return JSON({"error": e.message, "hint": e.hint}, status_code=404 if e.kind is ErrorKind.NOT_FOUND else 400)


def build(token: str, figures: Figures, metrics_only: bool = False) -> Starlette:
    """`metrics_only`: /metrics alone (`tpuctl ui --metrics-only`), no page."""
    scrape = metrics.registry_for(metrics.RunsCollector())

    def metrics_page(request: Request) -> Response:
        body, content_type = metrics.exposition(scrape, request.headers.get("accept", ""))
        return Response(body, headers={"Content-Type": content_type})

    def clusters_page(request: Request) -> Response:
        return _page("clusters", "Clusters", {"clusters": views.clusters(figures)})

    def runs_data(request: Request) -> dict[str, Any]:
        page = request.query_params.get("page", "0")
        return views.runs(figures, request.query_params.get("cluster") or None, int(page) if page.isdigit() else 0)

    def run_data(c: str, rid: str) -> dict[str, Any]:
        """The run as its store last answered (runview.run in the background, waited for briefly), or, before a
        first answer, that it is pending and for how long; a run that does not exist is a TpuctlError."""
        fig = figures.get(f"run:{c}:{rid}", functools.partial(runview.run, c, rid), max_age=0, wait=store_wait())
        if fig.value is None and fig.error:
            raise TpuctlError(ErrorKind.NOT_FOUND, fig.error, "the runs page lists them")
        now = time.time()
        if fig.value is None:
            return {"pending": f"its store has not answered ({fig.age(now)})", "cluster": c, "id": rid}
        late = fig.asked and now - fig.asked >= store_wait()
        return {**fig.value, "pending": f"its store is slow to answer: shown {fig.age(now)}" if late else ""}

    def runs_page(request: Request) -> Response:
        data = runs_data(request)
        return _page("runs", f"Runs of {data['cluster']}" if data["cluster"] else "Runs", data,
                     cluster=data["cluster"], page=str(data["page"]))

    def run_page(request: Request) -> Response:
        c, rid = request.path_params["cluster"], request.path_params["run_id"]
        try:
            data = run_data(c, rid)
        except TpuctlError as e:
            return _problem(e)
        return _page("run", f"Run {rid}", data, cluster=c, id=rid)

    def leftovers_page(request: Request) -> Response:
        return _page("leftovers", "Leftovers", views.leftovers(figures))

    def api(request: Request) -> Response:
        what = request.path_params["what"]
        try:
            if what == "clusters":
                return JSON({"clusters": views.clusters(figures)})
            if what == "runs":
                return JSON(runs_data(request))
            if what == "leftovers":
                return JSON(views.leftovers(figures))
            q = request.query_params
            if what == "run":
                return JSON(run_data(q.get("cluster", ""), q.get("id", "")))
            if what == "log":
                after, worker, skip = q.get("after", ""), q.get("worker", "0"), q.get("skip", "0")
                return JSON(runview.log(q.get("cluster", ""), q.get("id", ""), int(worker) if worker.isdigit() else 0,
                                        int(after) if after.isdigit() else None, int(skip) if skip.isdigit() else 0))
        except TpuctlError as e:
            return _problem(e)
        return JSON({"error": f"no /api/{what}"}, status_code=404)

    static = str(resources.files("tpuctl.ui") / "static")
    pages = [Route("/", clusters_page), Route("/runs", runs_page), Route("/leftovers", leftovers_page),
             Route("/run/{cluster}/{run_id}", run_page), Route("/api/{what}", api),
             Mount("/static", StaticFiles(directory=static), name="static")]
    app = Starlette(routes=[Route("/metrics", metrics_page)] + ([] if metrics_only else pages))
    app.add_middleware(TokenRequired, token=token)
    return app


def bind(port: int | None, addr: str = "127.0.0.1") -> "socket.socket":
    """127.0.0.1 unless `--bind` says otherwise (the pages show what the store holds to whoever can reach them);
    port 0 lets the system pick a free one, so two `tpuctl ui` never race for a port."""
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port or 0))
    except (OSError, OverflowError) as e:
        sock.close()
        where = f"--port {port}" if port else "a free port"
        raise TpuctlError(ErrorKind.INPUT, f"{where} cannot be used on {addr}: {getattr(e, 'strerror', None) or e}",
                          "pick another --port (or leave it out for a free one), or a --bind address of this "
                          "machine") from None
    sock.listen(128)
    return sock


def serve(port: int | None, ready: Callable[[str], None], addr: str = "127.0.0.1", metrics_only: bool = False,
          token_file: str | None = None) -> None:
    """Serve until Ctrl-C or SIGTERM (uvicorn's own handlers end it gracefully); `ready(url)` once listening.
    `token_file`: the token is written there (mode 0600) for a Prometheus's `credentials_file`, and left out of the
    URL; `metrics_only`: /metrics alone."""
    import uvicorn
    token = secrets.token_urlsafe(24)
    if token_file:
        tokenfile.write(token_file, token)
    sock = bind(port, addr)
    figures = Figures()
    config = uvicorn.Config(build(token, figures, metrics_only), log_level="warning", access_log=False,
                            lifespan="off")
    server = uvicorn.Server(config)
    host = f"[{addr}]" if ":" in addr else addr
    path = "/metrics" if metrics_only else "/"
    ready(f"http://{host}:{sock.getsockname()[1]}{path}" + ("" if token_file else f"?token={token}"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
