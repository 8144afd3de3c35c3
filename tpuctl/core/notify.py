"""Notifications (`up --notify URL`, `submit --notify URL`): one message per event, sent by whoever owns the event
(the host's agent for runs and its own stops, the watcher for preemption and recovery).

Each event is recorded in the store create-if-absent BEFORE it is sent (layout.notify_event): of two watchers, or
an agent restarted after it recorded one, only the writer that created the record sends it, so an event is sent at
most once; a sender that dies between the record and the send loses that message rather than repeating it.
Recording happens on one background thread per process; sending on one thread per URL while it has messages
(delivery.Outbox: it ends after TPUCTL_NOTIFY_IDLE seconds without one), each message retried with backoff until
TPUCTL_NOTIFY_RETRY_FOR seconds (300) have passed, each request bounded by TPUCTL_NOTIFY_TIMEOUT (10): a receiver
that fails or hangs never slows or fails training, nor another URL's messages. A message given up on, or still
unsent when the process stops, is recorded (layout.notify_unsent) and `status` says so.

An http(s) URL receives a JSON POST in the shape Slack's incoming webhooks take (a `text` member: Slack's "Sending
messages using incoming webhooks", `curl -X POST -H 'Content-type: application/json' -d '{"text":"Hello,
World!"}' https://hooks.slack.com/services/...`, docs.slack.dev/tools/java-slack-sdk/guides/incoming-webhooks;
Slack ignores members it does not know), plus a `tpuctl` object with the event's figures. Any other scheme
(`slack://`, `ntfys://`, `mailto://`, ...) goes to Apprise, which the host installs only when a cluster uses one.

URLs are secrets: they live in the store (layout.NOTIFY_TARGETS, a run's layout.run_notify) and are shown masked.
"""
from __future__ import annotations

import functools
import hashlib
import json
import queue
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from . import knobs, layout
from .delivery import Outbox
# delivery's, re-exported: the CLI and the tests send through this module
from .delivery import mask as mask, send_one as send_one, try_once as try_once
from .errors import bad_input
from .store import BlobStore

EVENTS = ("run.started", "run.finished", "run.failed", "run.restarted", "run.stalled", "cluster.preempted", "cluster.recovered",
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


# -- sending (delivery.py: one outbox per URL) -------------------------------------------------------------------
class Sender:
    """The process's recording thread: each event is recorded (once, in the store), then handed to the outbox of
    each of its URLs (delivery.Outbox), which sends it in order with that URL's own retry clock."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[BlobStore, str, dict[str, Any]]] = queue.Queue()
        self.idle = threading.Event()
        self.idle.set()
        self.outboxes: dict[str, Outbox] = {}
        self.lock = threading.Lock()
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
            self._outbox(url).put(_Pending(store, key, body), message)

    def _outbox(self, url: str) -> Outbox:
        with self.lock:
            for done in [u for u, box in self.outboxes.items() if u != url and box.ended()]:
                del self.outboxes[done]   # its thread ended idle; only this thread puts, so none is refilled now
            if url not in self.outboxes:
                self.outboxes[url] = Outbox(url, functools.partial(unsent, url))
            return self.outboxes[url]

    def flush(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) until every URL's outbox is done; what is left is recorded unsent (the
        process ends: its sending threads end with it). True when everything was sent or given up on in time."""
        deadline = time.monotonic() + timeout
        done = self.idle.wait(timeout)
        with self.lock:
            boxes = list(self.outboxes.values())
        for box in boxes:
            done = box.idle.wait(max(0.0, deadline - time.monotonic())) and done
        for box in boxes:
            if not box.idle.is_set():
                box.abandon(f"still unsent after {timeout:g}s when the process stopped (the receiver had not "
                            "taken it)")
        return done


class _Pending:
    """One event on its way to one URL."""

    def __init__(self, store: BlobStore, key: str, body: dict[str, Any]) -> None:
        self.store, self.key, self.body = store, key, body


def unsent(url: str, what: _Pending, error: str) -> None:
    """A message given up on is recorded where `status` looks (layout.notify_unsent), never silently dropped; the
    URL only masked."""
    print(f"tpuctl: notification {what.body['event']} to {mask(url)} not delivered: {error}", file=sys.stderr,
          flush=True)
    doc = {"event": what.body["event"], "key": what.key, "run": what.body.get("run", ""), "to": mask(url),
           "error": error, "time": time.time()}
    try:
        digest = hashlib.sha256(url.encode()).hexdigest()[:12]   # which URL, without the URL
        what.store.write(layout.notify_unsent(f"{what.key}-{digest}"), json.dumps(doc).encode())
    except Exception as e:  # noqa: BLE001 - the agent's log above still says it
        print(f"tpuctl: could not record it: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def undelivered(store: BlobStore) -> list[dict[str, Any]]:
    """The messages given up on, oldest first (`status`)."""
    out = []
    for key, _ in store.list(layout.NOTIFY_UNSENT_PREFIX):
        try:
            out.append(dict(json.loads(store.read(key) or b"{}")))
        except ValueError:
            continue
    return sorted(out, key=lambda d: float(d.get("time") or 0))


_sender: Sender | None = None
_lock = threading.Lock()


def sender() -> Sender:
    global _sender
    with _lock:
        if _sender is None:
            _sender = Sender()
        return _sender


def flush(timeout: float | None = None) -> None:
    """At a process's end: wait for what is queued, at most TPUCTL_NOTIFY_EXIT_WAIT seconds (5), so a dead
    receiver never holds an agent, a watcher or `down`; what is left then is recorded unsent."""
    if _sender is not None:
        _sender.flush(knobs.number("TPUCTL_NOTIFY_EXIT_WAIT", 5) if timeout is None else timeout)
