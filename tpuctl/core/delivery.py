"""How one notification reaches one URL (notify.py decides what is sent, and records it once, before).

- Each URL has its own outbox: a queue, a thread while it has messages, and a retry clock (TPUCTL_NOTIFY_RETRY_FOR
  seconds, 300, per message, backoff from TPUCTL_NOTIFY_BACKOFF), so a receiver that fails or hangs delays only its own messages;
  before, one 500 URL held every other URL's events for five minutes each (issue 38.2).
- A request waits TPUCTL_NOTIFY_TIMEOUT seconds (10) for its answer, the first try of a message always in full.
- A redirect is not a delivery. urllib follows 301/302/303 after a POST as a GET without the body
  (CPython Lib/urllib/request.py, HTTPRedirectHandler.redirect_request: `code in (301, 302, 303) and m == "POST"`
  is redirected, the new Request carries no data), so the receiver named by the redirect got nothing worth having
  while the sender saw a 200. Here 301/302/303 end the try ("redirected to HOST: not delivered"); 307 and 308,
  which keep the method and the body (RFC 9110 sections 15.4.8 and 15.4.9), are followed with both, and CPython
  refuses them for a POST on its own (the same condition), so they are re-sent here.
- A URL with user info (`https://user:token@host/...`) is sent to the URL without it, with the user info as HTTP
  basic authentication (RFC 7617), as curl does; urllib alone reads `user:token@host` as the host's name. The
  credentials go only to the URL's own origin (scheme, host and port), never to another a redirect names; a
  redirect from https to plain http is not followed at all (issue 52.7: both leaked the token in clear).
- A URL is a secret: only mask() of it is ever printed (its scheme and host).
"""
from __future__ import annotations

import base64
import collections
import importlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from types import ModuleType
from typing import Any, Callable
from urllib.parse import unquote, urlsplit, urlunsplit

from . import knobs


def mask(url: str) -> str:
    """What may be printed of a URL: its scheme and host; the path, query and credentials carry the secret."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}/***" if parts.scheme else "***"


def timeout() -> float:
    return knobs.number("TPUCTL_NOTIFY_TIMEOUT", 10)


class Redirected(Exception):
    """A 3xx that would not carry the message on: said as such, never as a delivery."""


class _Redirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        host = urlsplit(newurl).hostname or "?"
        if code not in (307, 308):
            raise Redirected(f"HTTP {code}, redirected to {host}: not delivered (a {code} turns the POST into a GET "
                             "without the message; give the URL it redirects to)")
        if urlsplit(req.full_url).scheme == "https" and urlsplit(newurl).scheme != "https":
            raise Redirected(f"HTTP {code}, redirected from https to plain {urlsplit(newurl).scheme} on {host}: not "
                             "delivered (the message would travel in clear; give the https URL it should go to)")
        keep = {k: v for k, v in req.header_items()
                if k.lower() != "authorization" or origin(newurl) == origin(req.full_url)}
        return urllib.request.Request(newurl, data=req.data, method=req.get_method(), headers=keep)


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in: the origin of RFC 6454 section 4, the only
    place a URL's credentials go (a redirect to another port of the same host, or from https to http, is another
    origin, as curl holds: "Another host means that one or more of hostname, protocol scheme or port number changed",
    curl.se/libcurl/c/CURLOPT_UNRESTRICTED_AUTH.html, off by default)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


_opener = urllib.request.build_opener(_Redirects())


def split_auth(url: str) -> tuple[str, dict[str, str]]:
    """(the URL without user info, the headers that carry it: basic authentication), or (url, {})."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, {}
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return (urlunsplit(parts._replace(netloc=netloc)),
            {"Authorization": "Basic " + base64.b64encode(pair).decode()})


def post(url: str, message: dict[str, Any], wait: float) -> str:
    """One POST; the receiver's answer ("HTTP 200 OK") or an exception (4xx/5xx raise HTTPError)."""
    plain, auth = split_auth(url)
    req = urllib.request.Request(plain, data=json.dumps(message).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **auth})
    try:
        with _opener.open(req, timeout=wait) as r:
            r.read()
            return f"HTTP {r.status} {r.reason}".strip()
    except Exception as e:  # noqa: BLE001 - re-raised without the URL (the plain one has the path's secret too)
        if plain != url and plain in str(e):
            raise RuntimeError(str(e).replace(plain, mask(url))) from None
        raise


APPRISE = "apprise>=1.6,<3"   # Apprise().add / notify(body=, title=) and its truthy result hold across these


def agent_home() -> str:
    """Where a host keeps what its agent installs for itself (Apprise, tpu-info): never the image's or the user's
    environment."""
    return os.environ.get("TPUCTL_AGENT_HOME") or os.path.join(os.path.expanduser("~"), ".tpuctl-agent")


def apprise_dir() -> str:
    """Where a host installs Apprise for itself when a cluster first uses an Apprise URL: beside the agent's work."""
    return os.environ.get("TPUCTL_APPRISE_DIR") or os.path.join(agent_home(), "apprise")


def _load_apprise() -> ModuleType:
    """The apprise module: installed, or in apprise_dir(), or installed there now (pip, once per process, on the
    sending thread: a run never waits for it)."""
    target = apprise_dir()
    if target not in sys.path:
        sys.path.append(target)
    try:
        return importlib.import_module("apprise")
    except ImportError:
        pass
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
                        target, APPRISE], capture_output=True, text=True,
                       timeout=knobs.number("TPUCTL_APPRISE_INSTALL_WAIT", 300))
    if r.returncode:
        raise RuntimeError(f"could not install {APPRISE} into {target}: {r.stderr.strip()[-300:]}")
    importlib.invalidate_caches()
    return importlib.import_module("apprise")


def apprise(url: str, message: dict[str, Any], wait: float) -> str:
    # Apprise's Python API: Apprise().add(url) then notify(body=..., title=...), whose result is false when it could
    # not deliver (apprise/apprise.py `def notify(self, body, title="", ...)`, result.py `__bool__`: "True only when
    # the overall notification succeeded"; github.com/apache/airflow airflow/providers/apprise/hooks/apprise.py
    # calls it the same way).
    ap = _load_apprise().Apprise()
    if not ap.add(url):
        raise ValueError("Apprise does not understand this URL")
    if not ap.notify(body=message["text"], title=f"tpuctl: {message['tpuctl']['event']}"):
        raise RuntimeError("Apprise could not deliver it")
    return "Apprise took it"


def try_once(url: str, message: dict[str, Any], wait: float | None = None) -> tuple[bool, str]:
    """(delivered, what the receiver answered or why not), the URL masked: `tpuctl notify test`."""
    deliver = post if urlsplit(url).scheme in ("http", "https") else apprise
    try:
        return True, deliver(url, message, timeout() if wait is None else wait)
    except Exception as e:  # noqa: BLE001 - any failure to deliver is the answer
        said = str(e) if isinstance(e, Redirected) else f"{type(e).__name__}: {e}"
        return False, said.replace(url, mask(url))


def send_one(url: str, message: dict[str, Any], retry_for: float | None = None,
             stop: threading.Event | None = None) -> str:
    """Deliver one message, retrying with backoff until `retry_for` seconds have passed (or `stop` is set);
    "" or the last error. Every try waits up to timeout() for its answer, the first in full."""
    retry_for = knobs.number("TPUCTL_NOTIFY_RETRY_FOR", 300) if retry_for is None else retry_for
    give_up, delay = time.monotonic() + retry_for, knobs.number("TPUCTL_NOTIFY_BACKOFF", 1)
    wait = timeout()
    while True:
        ok, said = try_once(url, message, wait)
        if ok:
            return ""
        if time.monotonic() + delay > give_up or (stop is not None and stop.is_set()):
            return said
        if stop is not None and stop.wait(delay):
            return said
        if stop is None:
            time.sleep(delay)
        delay = min(delay * 2, 30.0)
        wait = min(timeout(), max(give_up - time.monotonic(), 1.0))


def max_threads() -> int:
    """The threads that send notifications at most, every URL's together (TPUCTL_NOTIFY_THREADS, 8)."""
    return knobs.count("TPUCTL_NOTIFY_THREADS", 8)


class _Senders:
    """The threads every Outbox shares: at most max_threads(), each taking an outbox that has messages and
    sending them in order until it is empty, then the next; a thread ends once none has come for
    TPUCTL_NOTIFY_IDLE seconds (60). A thread per URL grew with the URLs an agent saw (1 -> 62 after 60 runs with
    distinct URLs, issue 58.5); past the cap an outbox waits its turn (a URL failing holds its thread up to
    TPUCTL_NOTIFY_RETRY_FOR, so only as many URLs failing at once as there are threads delay the others)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.ready: collections.deque[Outbox] = collections.deque()
        self.threads = 0
        self.waiting = 0   # threads waiting for an outbox

    def submit(self, box: "Outbox") -> None:
        with self.cond:
            self.ready.append(box)
            if len(self.ready) <= self.waiting:   # a waiting thread for each outbox that waits
                self.cond.notify()
            elif self.threads < max_threads():
                self.threads += 1
                threading.Thread(target=self._work, daemon=True, name=f"tpuctl-notify-{self.threads}").start()

    def _work(self) -> None:
        while True:
            with self.cond:
                if not self.ready:
                    self.waiting += 1
                    self.cond.wait(knobs.number("TPUCTL_NOTIFY_IDLE", 60))
                    self.waiting -= 1
                if not self.ready:
                    self.threads -= 1
                    return
                box = self.ready.popleft()
            box._drain()


_SENDERS = _Senders()


class Outbox:
    """One URL's messages, sent in order by one of the shared threads (_Senders) at a time, each with its own
    retry clock. `unsent(what, error)` is told of each message given up on (notify.py records it where `status`
    looks)."""

    def __init__(self, url: str, unsent: Callable[[Any, str], None]) -> None:
        self.url, self.unsent = url, unsent
        self.q: queue.Queue[tuple[Any, dict[str, Any]]] = queue.Queue()
        self.lock = threading.Lock()
        self.pending: list[Any] = []   # what is queued or being sent, oldest first
        self.idle = threading.Event()
        self.idle.set()
        self.stop = threading.Event()   # set by abandon: the try under way gives up
        self.sending = False            # handed to the shared threads (under the lock: put hands it once)

    def put(self, what: Any, message: dict[str, Any]) -> None:
        with self.lock:
            self.pending.append(what)
            self.idle.clear()
            self.q.put((what, message))
            if self.sending:
                return
            self.sending = True
        _SENDERS.submit(self)

    def ended(self) -> bool:
        """Nothing queued and not handed to a thread: the outbox may be forgotten (the next message makes another)."""
        with self.lock:
            return not self.sending and not self.pending

    def _drain(self) -> None:
        """Send what is queued, in order, until nothing is; marked done under the lock that put holds, so a
        message put meanwhile is never left unsent."""
        while True:
            with self.lock:
                if self.q.empty():
                    self.sending = False
                    return
                what, message = self.q.get_nowait()
                if what not in self.pending:
                    continue   # given up already (abandon): recorded there
                stop = self.stop
            error = send_one(self.url, message, stop=stop)
            with self.lock:
                if what not in self.pending:
                    continue
                self.pending.remove(what)
            if error:
                self.unsent(what, error)
            with self.lock:
                if not self.pending:
                    self.idle.set()

    def abandon(self, why: str) -> None:
        """The process ends: every message not yet delivered is recorded unsent now, never silently dropped."""
        with self.lock:
            self.stop.set()
            self.stop = threading.Event()   # the try under way ends; a later message (a stop that failed and goes
            left, self.pending = self.pending, []   # on) is sent as any other
            self.idle.set()
        for what in left:
            self.unsent(what, why)
