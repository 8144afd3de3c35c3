"""A running session's log as Kaggle streams it (client.Kaggle.log_events), read on a thread so that the command
following the run (`submit`, `logs -f`) shows the job's lines while the session runs, not when it ends.

The stream replays from the first event on each connection (kaggle_api_extended `kernels_logs_cli`: "the server
replays the stream from the beginning, so we dedup by counting events"), so `events` holds each event once, by its
index; the run's record keeps how many it has written into the run's log, and the session's stored log (read when
the session has ended) adds only the entries after those. A dropped connection is made again after
TPUCTL_KAGGLE_STREAM_RETRY seconds (1, the client's `_LOG_STREAM_RECONNECT_DELAY_SEC`); five drops in a row with no
new event end the stream (the client's `_LOG_STREAM_MAX_FAILURES`): the session's stored log still comes at its end.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Iterator

from ...core import knobs
from ...core.errors import TpuctlError
from .client import Kaggle, http_error, log_entries

MAX_FAILURES = 5


class LiveLog:
    def __init__(self, kaggle: Kaggle, slug: str) -> None:
        self.kaggle, self.slug = kaggle, slug
        self.events: list[str] = []
        self.finished, self.ended_at = False, 0.0
        self._stop = threading.Event()
        # What the thread imports is imported on this one first: a Ctrl-C that lands while two threads import at once
        # can leave one of CPython's module locks held, and the command then hangs instead of stopping (a `logs -f`
        # stopped in its first second hung so in a test, about 1 run in 8).
        import requests  # noqa: F401
        try:
            import kagglesdk  # noqa: F401
        except ImportError:
            pass   # the thread's first call says how to install it
        threading.Thread(target=self._read, daemon=True, name=f"kaggle-log-{slug}").start()

    def stop(self) -> None:
        self._stop.set()

    def _read(self) -> None:
        import requests
        failures = 0
        try:
            while not self._stop.is_set():
                seen = len(self.events)
                try:
                    for i, text in enumerate(events(self.kaggle, self.slug)):
                        if self._stop.is_set():
                            return
                        if i >= len(self.events):
                            self.events.append(text)
                    return
                except requests.RequestException:   # dropped, cut mid-chunk, silent past the read timeout
                    failures = 0 if len(self.events) > seen else failures + 1
                    if failures >= MAX_FAILURES:
                        return
                    self._stop.wait(knobs.number("TPUCTL_KAGGLE_STREAM_RETRY", 1))
                except TpuctlError:   # the kernel gone or a refusal: the status poll says what became of it
                    return
        finally:
            self.finished, self.ended_at = True, time.time()


def events(k: Kaggle, slug: str, wait: int = 60) -> Iterator[str]:
    """The session's log as it is written: each event's text, from the first, until the session ends.
    kaggle_api_extended `kernels_logs_stream`: `GET {api}/v1/kernels/logs/stream/{owner}/{slug}` answers
    Server-Sent Events (`data: {"stream_name", "time", "data"}` ... `data: END_OF_LOG`) while the session runs,
    or the stored log (a JSON list of the same entries) once it has ended; a reconnection replays from the
    start. Connection errors are the caller's (it reconnects)."""
    import requests
    with k.client() as kaggle:
        http = kaggle._http_client   # its session and auth, as kaggle_api_extended itself reaches them here
        http._init_session()
        base = http._endpoint if http._env.name == "PROD" else f"{http._endpoint}/api"
        headers = {k: v for k, v in http._session.headers.items() if k != "Content-Type"}
        headers["Accept"] = "text/event-stream, */*"
        r = http._session.get(f"{base}/v1/kernels/logs/stream/{k.user}/{slug}", stream=True, headers=headers,
                              auth=http._session.auth, params={"waitForLogsUrlSeconds": wait}, timeout=(30, 600))
        try:
            if r.status_code >= 400:
                raise http_error(f"log of {slug}", r.status_code, requests.HTTPError(r.reason), k.creds.source)
            if not (r.headers.get("Content-Type") or "").lower().startswith("text/event-stream"):
                yield from log_entries(r.text)
                return
            for line in r.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:"):
                    continue
                payload = line[len("data:"):].lstrip()
                if payload == "END_OF_LOG":
                    return
                try:
                    event = json.loads(payload)
                    yield str(event.get("data", "")) if isinstance(event, dict) else payload
                except ValueError:
                    yield payload
        finally:
            r.close()
