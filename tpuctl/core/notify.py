"""Notifications (`up --notify URL`, `submit --notify URL`): one message per event, sent by whoever owns the event
(the host's agent for runs and its own stops, the watcher for preemption and recovery).

Each event is recorded in the store create-if-absent BEFORE it is sent (layout.notify_event): of two watchers, or
an agent restarted after it recorded one, only the writer that created the record sends it, so an event is sent at
most once; a sender that dies between the record and the send loses that message rather than repeating it.
Sending happens on one background thread per process, in order, each message retried with backoff until
TPUCTL_NOTIFY_RETRY_FOR seconds (300) have passed, each request bounded by TPUCTL_NOTIFY_TIMEOUT (10): a receiver
that fails or hangs never slows or fails training.

An http(s) URL receives a JSON POST in the shape Slack's incoming webhooks take (a `text` member: Slack's "Sending
messages using incoming webhooks", `curl -X POST -H 'Content-type: application/json' -d '{"text":"Hello,
World!"}' https://hooks.slack.com/services/...`, docs.slack.dev/tools/java-slack-sdk/guides/incoming-webhooks;
Slack ignores members it does not know), plus a `tpuctl` object with the event's figures. Any other scheme
(`slack://`, `ntfys://`, `mailto://`, ...) goes to Apprise, which the host installs only when a cluster uses one.

URLs are secrets: they live in the store (layout.NOTIFY_TARGETS, a run's layout.run_notify) and are shown masked.
"""
from __future__ import annotations

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
from typing import Any
from urllib.parse import urlsplit

from . import layout
from .errors import bad_input
from .store import BlobStore

EVENTS = ("run.started", "run.finished", "run.failed", "run.restarted", "cluster.preempted", "cluster.recovered",
          "cluster.stopped", "cluster.recovery_given_up", "budget.warning", "test")
STOP_REASONS = ("autostop", "max-duration", "budget", "run-down")


def stop_kind(reason: str) -> str:
    """cluster.stopped's `reason` (one of STOP_REASONS) from the stop record's text (core/lifecycle.py, budget.py,
    host/agent.py's `submit --down`)."""
    if reason.startswith("autostop"):
        return "autostop"
    if reason.startswith("max-duration"):
        return "max-duration"
    if reason.startswith("budget"):
        return "budget"
    return "run-down"


def check_urls(urls: list[str], flag: str = "--notify") -> list[str]:
    """Each URL has a scheme and somewhere to go; repeats dropped."""
    out: list[str] = []
    for u in urls:
        parts = urlsplit(u.strip())
        if not parts.scheme or not (parts.netloc or parts.path):
            raise bad_input(f"{flag} {mask(u)!r} is not a URL",
                            "a webhook (https://hooks.slack.com/services/...) or an Apprise URL (ntfys://topic)")
        if u.strip() not in out:
            out.append(u.strip())
    return out


def is_off(given: list[str]) -> bool:
    """`--notify off` (alone): the cluster's URLs are removed. Mixed with URLs it is a mistake, not a URL."""
    if not any(g.strip().lower() == "off" for g in given):
        return False
    if len(given) > 1:
        raise bad_input("--notify off cannot be given with URLs", "give either --notify off or the URLs to send to")
    return True


def mask(url: str) -> str:
    """What may be printed of a URL: its scheme and host; the path, query and credentials carry the secret."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}/***" if parts.scheme else "***"


def needs_apprise(urls: list[str]) -> bool:
    return any(urlsplit(u).scheme not in ("http", "https") for u in urls)


# -- where the URLs live ---------------------------------------------------------------------------------------
def save_cluster_urls(store: BlobStore, urls: list[str]) -> None:
    store.write(layout.NOTIFY_TARGETS, json.dumps({"urls": urls}).encode())


def save_run_urls(store: BlobStore, run_id: str, urls: list[str]) -> None:
    if urls:
        store.write(layout.run_notify(run_id), json.dumps({"urls": urls}).encode())


def _urls_at(store: BlobStore, key: str) -> list[str]:
    try:
        raw = store.read(key)
        return [str(u) for u in json.loads(raw).get("urls", [])] if raw else []
    except Exception:  # noqa: BLE001 - an unreadable list sends nothing; it never stops the caller
        return []


def cluster_urls(store: BlobStore) -> list[str]:
    return _urls_at(store, layout.NOTIFY_TARGETS)


def targets(store: BlobStore, run: str = "") -> list[str]:
    urls = cluster_urls(store)
    return urls + [u for u in (_urls_at(store, layout.run_notify(run)) if run else []) if u not in urls]


# -- events ----------------------------------------------------------------------------------------------------
def text_of(event: str, cluster: str, run: str, fields: dict[str, Any]) -> str:
    about = f"run {run} on {cluster}" if run else f"cluster {cluster}"
    # figures to 4 decimals in the text (the loss read `7.509448051452637`); the `tpuctl` object keeps them whole
    extra = ", ".join(f"{k} {round(v, 4) if isinstance(v, float) else v}" for k, v in fields.items()
                      if k not in ("log_tail",) and v not in (None, ""))
    text = f"tpuctl: {about}: {event}" + (f" ({extra})" if extra else "")
    if fields.get("log_tail"):
        text += "\n```\n" + str(fields["log_tail"]) + "\n```"
    return text


def emit(store: BlobStore, event: str, key: str, cluster: str, run: str = "", **fields: Any) -> None:
    """Queue the event; the sending thread records it once under `key` (unique to this occurrence: a run id, when
    the compute was lost) and, if its record is the one that was created, sends it to every target. Returns at
    once and never raises: a notification must not slow or fail what it reports on."""
    sender().put(store, key, {"event": event, "cluster": cluster, "run": run, "time": time.time(), **fields})


def record(store: BlobStore, key: str, body: dict[str, Any]) -> bool:
    """Create-if-absent: True for the one writer that created the record (and so sends the event)."""
    return store.create(layout.notify_event(key), json.dumps(body).encode())


# -- sending ---------------------------------------------------------------------------------------------------
def _post(url: str, message: dict[str, Any], timeout: float) -> None:
    req = urllib.request.Request(url, data=json.dumps(message).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:   # 4xx/5xx raise HTTPError
        r.read()


APPRISE = "apprise>=1.6,<3"   # Apprise().add / notify(body=, title=) and its truthy result hold across these


def apprise_dir() -> str:
    """Where a host installs Apprise for itself when a cluster first uses an Apprise URL: beside the agent's work,
    never into the image's or the user's environment."""
    base = os.environ.get("TPUCTL_AGENT_HOME") or os.path.join(os.path.expanduser("~"), ".tpuctl-agent")
    return os.environ.get("TPUCTL_APPRISE_DIR") or os.path.join(base, "apprise")


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
                       timeout=float(os.environ.get("TPUCTL_APPRISE_INSTALL_WAIT", "300")))
    if r.returncode:
        raise RuntimeError(f"could not install {APPRISE} into {target}: {r.stderr.strip()[-300:]}")
    importlib.invalidate_caches()
    return importlib.import_module("apprise")


def _apprise(url: str, message: dict[str, Any], timeout: float) -> None:
    # Apprise's Python API: Apprise().add(url) then notify(body=..., title=...), whose result is false when it could
    # not deliver (apprise/apprise.py `def notify(self, body, title="", ...)`, result.py `__bool__`: "True only when
    # the overall notification succeeded"; github.com/apache/airflow airflow/providers/apprise/hooks/apprise.py
    # calls it the same way).
    ap = _load_apprise().Apprise()
    if not ap.add(url):
        raise ValueError("Apprise does not understand this URL")
    if not ap.notify(body=message["text"], title=f"tpuctl: {message['tpuctl']['event']}"):
        raise RuntimeError("Apprise could not deliver it")


def send_one(url: str, message: dict[str, Any], retry_for: float | None = None) -> str:
    """Deliver one message, retrying with backoff until `retry_for` seconds have passed; "" or the last error."""
    retry_for = float(os.environ.get("TPUCTL_NOTIFY_RETRY_FOR", "300")) if retry_for is None else retry_for
    timeout = float(os.environ.get("TPUCTL_NOTIFY_TIMEOUT", "10"))
    deliver = _post if urlsplit(url).scheme in ("http", "https") else _apprise
    give_up, delay, error = time.monotonic() + retry_for, float(os.environ.get("TPUCTL_NOTIFY_BACKOFF", "1")), ""
    while True:
        try:
            deliver(url, message, min(timeout, max(give_up - time.monotonic(), 0.1)))
            return ""
        except Exception as e:  # noqa: BLE001 - any failure to deliver: retried, then reported
            error = f"{type(e).__name__}: {e}".replace(url, mask(url))
        if time.monotonic() + delay > give_up:
            return error
        time.sleep(delay)
        delay = min(delay * 2, 30.0)


class Sender:
    """The process's one sending thread: events are recorded, then sent, in the order they were emitted."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[BlobStore, str, dict[str, Any]]] = queue.Queue()
        self.idle = threading.Event()
        self.idle.set()
        threading.Thread(target=self._loop, daemon=True, name="tpuctl-notify").start()

    def put(self, store: BlobStore, key: str, body: dict[str, Any]) -> None:
        self.idle.clear()
        self.q.put((store, key, body))

    def _loop(self) -> None:
        while True:
            store, key, body = self.q.get()
            try:
                self._one(store, key, body)
            except Exception as e:  # noqa: BLE001 - a store that refuses: said on stderr (the agent's log)
                print(f"tpuctl: notification {body['event']} not recorded: {type(e).__name__}: {e}", file=sys.stderr,
                      flush=True)
            if self.q.empty():
                self.idle.set()

    def _one(self, store: BlobStore, key: str, body: dict[str, Any]) -> None:
        if not record(store, key, body):
            return   # recorded before: whoever recorded it sends it
        fields = {k: v for k, v in body.items() if k not in ("event", "cluster", "run", "time")}
        message = {"text": text_of(body["event"], body["cluster"], body["run"], fields), "tpuctl": body}
        for url in targets(store, body["run"]):
            error = send_one(url, message)
            if error:
                print(f"tpuctl: notification {body['event']} to {mask(url)} not delivered: {error}", file=sys.stderr,
                      flush=True)

    def flush(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until everything queued was sent or given up: at a process's end."""
        return self.idle.wait(timeout)


_sender: Sender | None = None
_lock = threading.Lock()


def sender() -> Sender:
    global _sender
    with _lock:
        if _sender is None:
            _sender = Sender()
        return _sender


def flush(timeout: float | None = None) -> None:
    """At a process's end: wait for what is queued, at most TPUCTL_NOTIFY_EXIT_WAIT seconds (30), so a dead
    receiver never holds an agent or a watcher that is done."""
    if _sender is not None:
        _sender.flush(float(os.environ.get("TPUCTL_NOTIFY_EXIT_WAIT", "30")) if timeout is None else timeout)
