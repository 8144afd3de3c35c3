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

import os
import threading
import time

from ...core.errors import TpuctlError
from .client import Kaggle

MAX_FAILURES = 5


class LiveLog:
    def __init__(self, kaggle: Kaggle, slug: str) -> None:
        self.kaggle, self.slug = kaggle, slug
        self.events: list[str] = []
        self.finished = False
        self._stop = threading.Event()
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
                    for i, text in enumerate(self.kaggle.log_events(self.slug)):
                        if self._stop.is_set():
                            return
                        if i >= len(self.events):
                            self.events.append(text)
                    return
                except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                    failures = 0 if len(self.events) > seen else failures + 1
                    if failures >= MAX_FAILURES:
                        return
                    self._stop.wait(float(os.environ.get("TPUCTL_KAGGLE_STREAM_RETRY", "1")))
                except TpuctlError:   # the kernel gone or a refusal: the status poll says what became of it
                    return
        finally:
            self.finished, self.ended_at = True, time.time()
