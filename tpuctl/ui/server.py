"""`tpuctl ui`'s web server: Starlette routes over views.py and runview.py, served by uvicorn on 127.0.0.1 only.

Every page is one small HTML document that carries its own data (so the first byte already holds what the page
shows) and app.js, which draws it and then asks the same data again every TPUCTL_UI_POLL_SECONDS (2 s) under
/api/ (the log: only the chunks after the last one it has). Only GET and HEAD exist: no page changes anything.

The token: every request must carry it, in the query (`?token=`, as the printed URL and the links a page follows
have it) or in the header X-Tpuctl-Token (how app.js asks /api/); anything else is answered 403. No cookie is set:
a browser sends a cookie of 127.0.0.1 to every port of 127.0.0.1 (cookies ignore ports, RFC 6265 section 8.5), so
any local server the user visits would receive a credential this server accepts. The page carries the token
itself (a meta tag), and app.js keeps it in sessionStorage, which is per origin (port included) and never sent, so
two `tpuctl ui` in one browser never replace each other's. A request whose Host is not this machine's own name for
the server (127.0.0.1, localhost, or the address it was told to bind) is refused (a DNS-rebinding page's requests
carry its own name). `Authorization: Bearer <token>` is taken too (how Prometheus scrapes /metrics:
metrics.py)."""
from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import html
import logging
import secrets
import socket
import time
from importlib import resources
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..core import jobfiles, knobs
from ..core.errors import ErrorKind, TpuctlError
from . import metrics, runview, tokenfile, views
from .figures import Figures, store_wait

if TYPE_CHECKING:
    import uvicorn

HEADER = "X-Tpuctl-Token"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})

# Every answer: never framed, never cached, no Referer leaves a page (a followed link to the Cloud Console carries
# nothing of the URL), and a page runs only this server's own scripts and asks only this server.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SAFETY = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
          "X-Content-Type-Options": "nosniff", "Content-Security-Policy": CSP}

# A page asked without the token (a reload, Back, a link opened in a new tab: the address bar holds no token, app.js
# takes it out) is answered 403 with this script, allowed by its hash alone: where this tab already holds the token
# for this origin (sessionStorage), it asks the same page again with it; else it says what to open.
RETRY = ('const t=sessionStorage.getItem("tpuctl-token"),u=new URL(location.href);'
         'if(t&&!u.searchParams.has("token")){u.searchParams.set("token",t);location.replace(u.href);}'
         'else{sessionStorage.removeItem("tpuctl-token");document.getElementById("why").hidden=false;}')
RETRY_CSP = CSP.replace("script-src 'self'", "script-src 'sha256-"
                        + base64.b64encode(hashlib.sha256(RETRY.encode()).digest()).decode() + "'")
LOCKED = ("403: this page needs the token `tpuctl ui` printed (open the URL it printed; this tab may have been opened "
          "before it restarted)\n")


def poll_seconds() -> float:
    return knobs.number("TPUCTL_UI_POLL_SECONDS", 2)


def same_token(given: str | None, token: str) -> bool:
    """Compared as bytes: compare_digest refuses a str with a character beyond ASCII (a TypeError: a 500)."""
    return bool(given) and secrets.compare_digest(str(given).encode("utf-8", "replace"), token.encode())


def host_name(host: str) -> str:
    """The name in a Host header, without its port: `127.0.0.1:8700` -> 127.0.0.1, `[::1]:8700` -> ::1."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _refused(text: str, status: int, request: Request | None = None) -> Response:
    if request is not None and "text/html" in request.headers.get("accept", ""):   # a browser's page
        body = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>tpuctl ui</title></head><body>'
                f'<p id="why" hidden>{html.escape(text)}</p><script>{RETRY}</script></body></html>')
        return HTMLResponse(body, status_code=status, headers={**SAFETY, "Content-Security-Policy": RETRY_CSP})
    return Response(text, status_code=status, media_type="text/plain", headers=SAFETY)


class TokenRequired(BaseHTTPMiddleware):
    def __init__(self, app: Any, token: str, hosts: frozenset[str] = LOCAL_HOSTS) -> None:
        super().__init__(app)
        self.token = token
        self.hosts = frozenset(h.lower() for h in hosts)

    async def dispatch(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if host_name(request.headers.get("host", "")) not in self.hosts:
            return _refused(f"403: tpuctl ui answers only as {' or '.join(sorted(self.hosts))}\n", 403)
        given = (request.query_params.get("token") or request.headers.get(HEADER)
                 or metrics.bearer(request.headers.get("authorization")))   # Prometheus's credentials_file
        if not same_token(given, self.token):
            return _refused(LOCKED, 403, request)
        if request.method not in ("GET", "HEAD"):
            return _refused("405: tpuctl ui only reads\n", 405)
        response = await call_next(request)
        for k, v in SAFETY.items():
            response.headers.setdefault(k, v)
        return response


SHUTDOWN_SECONDS = 2   # what Ctrl-C waits for requests in flight at most


def _not_the_stop(record: logging.LogRecord) -> bool:
    """uvicorn's log, less what a stop past SHUTDOWN_SECONDS says of the answers it drops: "Cancel N running
    task(s), timeout graceful shutdown exceeded" and each one's "Exception in ASGI application" with the traceback
    of its CancelledError (uvicorn/server.py _wait_tasks_to_complete; protocols/http/h11_impl.py run_asgi). A tab
    that stops reading its answer is no error of tpuctl's, and Ctrl-C is one line ("tpuctl ui stopped")."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (isinstance(exc, asyncio.CancelledError) or "timeout graceful shutdown exceeded" in record.getMessage())


MAX_PAGE = 1_000_000   # pages of runs: past any store's


def whole(name: str, text: str, default: int, most: int) -> int:
    """The whole number `name` of a query (`page`, `worker`, `after`, `skip`): `default` when not given, refused
    (400) unless in ASCII digits (str.isdigit() takes "²" and "٣" too, and int("²") raised: a 500); past `most` it
    is `most` (a page 10**30 lists no store whole)."""
    if not text:
        return default
    if not (text.isascii() and text.isdigit()):
        raise TpuctlError(ErrorKind.INPUT, f"{name}={text!r} is not a whole number", "the pages' links give one")
    return min(int(text[:19]) if len(text) <= 19 else most, most)


def _page_of(token: str, view: str, title: str, data: dict[str, Any], **attrs: str) -> HTMLResponse:
    # strict JSON (no NaN: JSON.parse refuses it and the page stays blank), and no <, > or & inside the script
    # element, whose text ends at the first "</script" and which "<!--<script" sends into another parse state
    # (HTML's script data escaped states): as \u escapes, which JSON.parse reads back as the same characters
    payload = jobfiles.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    extra = "".join(f' data-{k}="{html.escape(v)}"' for k, v in attrs.items())
    t = f"?token={token}"   # a stylesheet or script element sends no header: its URL carries the token
    return HTMLResponse(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="tpuctl-token" content="{html.escape(token)}">
<title>{html.escape(title)} - tpuctl</title>
<link rel="stylesheet" href="/static/uPlot.min.css{t}"><link rel="stylesheet" href="/static/app.css{t}">
</head><body>
<nav><a href="/">Clusters</a> <a href="/runs">Runs</a> <a href="/leftovers">Leftovers</a></nav>
<main id="app" data-view="{view}" data-poll="{poll_seconds():g}"{extra}><h1>{html.escape(title)}</h1></main>
<script id="data" type="application/json">{payload}</script>
<script src="/static/uPlot.iife.min.js{t}"></script><script src="/static/app.js{t}"></script>
</body></html>""")


class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return jobfiles.dumps(content, separators=(",", ":")).encode()   # strict JSON: no NaN


def _problem(e: TpuctlError) -> Response:
    return JSON({"error": e.message, "hint": e.hint}, status_code=404 if e.kind is ErrorKind.NOT_FOUND else 400)


def build(token: str, figures: Figures, hosts: frozenset[str] = LOCAL_HOSTS, metrics_only: bool = False) -> Starlette:
    """The app; `hosts`: the names a request's Host may give (127.0.0.1 and localhost, and an address bound);
    `metrics_only`: /metrics alone (`tpuctl ui --metrics-only`), no page."""
    _page = functools.partial(_page_of, token)
    scrape = metrics.registry_for(metrics.RunsCollector())

    def metrics_page(request: Request) -> Response:
        body, content_type = metrics.exposition(scrape, request.headers.get("accept", ""))
        return Response(body, headers={"Content-Type": content_type})

    def clusters_page(request: Request) -> Response:
        return _page("clusters", "Clusters", {"clusters": views.clusters(figures)})

    def runs_data(request: Request) -> dict[str, Any]:
        return views.runs(figures, request.query_params.get("cluster") or None,
                          whole("page", request.query_params.get("page", ""), 0, MAX_PAGE))

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
        try:
            data = runs_data(request)
        except TpuctlError as e:
            return _problem(e)
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
                after = whole("after", q.get("after", ""), -1, 1 << 40)   # none: the log's tail
                return JSON(runview.log(q.get("cluster", ""), q.get("id", ""),
                                        whole("worker", q.get("worker", ""), 0, 1 << 20), None if after < 0 else after,
                                        whole("skip", q.get("skip", ""), 0, 1 << 40)))
        except TpuctlError as e:
            return _problem(e)
        return JSON({"error": f"no /api/{what}"}, status_code=404)

    static = str(resources.files("tpuctl.ui") / "static")
    pages = [Route("/", clusters_page), Route("/runs", runs_page), Route("/leftovers", leftovers_page),
             Route("/run/{cluster}/{run_id}", run_page), Route("/api/{what}", api),
             Mount("/static", StaticFiles(directory=static), name="static")]
    app = Starlette(routes=[Route("/metrics", metrics_page)] + ([] if metrics_only else pages))
    app.add_middleware(TokenRequired, token=token, hosts=hosts)
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


def uvicorn_config(app: Starlette, **settings: Any) -> "uvicorn.Config":
    """uvicorn's settings for tpuctl's server, without uvicorn's logging set-up: its default (`log_config=LOGGING_CONFIG`)
    runs `logging.config.dictConfig`, which closes every logging handler of the process first
    (`_clearExistingHandlers`), and absl's handler (absl/logging/__init__.py PythonHandler.close) closes the stream it
    took at import unless that is the sys.stderr of the moment: the server run beside TensorFlow or JAX in one process
    closed that process's stderr (a test worker's capture file: every later test there failed). uvicorn's warnings
    still reach stderr through the logging module's last-resort handler."""
    import uvicorn
    return uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="off", **settings)


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
    # Ctrl-C: uvicorn waits for every open connection to close, without end unless told (a page's poll in flight
    # on a slow store, a client that never finishes its request); past SHUTDOWN_SECONDS it drops them
    logging.getLogger("uvicorn.error").addFilter(_not_the_stop)   # uvicorn's own logger (no handler: the root's)
    server = uvicorn.Server(uvicorn_config(build(token, figures, LOCAL_HOSTS | {addr.lower()}, metrics_only),
                                           timeout_graceful_shutdown=SHUTDOWN_SECONDS))
    host = f"[{addr}]" if ":" in addr else addr
    path = "/metrics" if metrics_only else "/"
    ready(f"http://{host}:{sock.getsockname()[1]}{path}" + ("" if token_file else f"?token={token}"))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
