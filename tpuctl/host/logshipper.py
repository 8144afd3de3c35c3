"""The agent's log shipping: a job's merged stdout/stderr as numbered chunks in the store, each written once."""
from __future__ import annotations

import os
import select
import threading
import time

from ..core import layout
from .preamble import PreambleFilter
from ..core.store import BlobStore

FLUSH_SECONDS = 0.5
CHUNK_BYTES = 64 * 1024


class LogShipper:
    """Reads the child's merged output and writes it as chunks 000001.log, 000002.log, ... each written once."""

    def __init__(self, store: BlobStore, run_id: str, worker: int, quiet: PreambleFilter | None = None) -> None:
        self.store, self.run_id, self.worker = store, run_id, worker
        self.quiet = quiet   # drops TensorFlow's start-up preamble from the job's output (preamble.py)
        # a resumed run appends to the log its earlier attempt left
        self.n = len(store.list(layout.run_logs(run_id, worker)))
        self.buf = bytearray()
        self.first: float | None = None

    def note(self, text: str, fresh_line: bool = False) -> None:
        """A line of the agent's own into the run's log, in order with the job's output; fresh_line starts it on a
        new line when the log may end mid-line (an earlier attempt cut off)."""
        self.buf += f"{chr(10) if fresh_line else ''}tpuctl agent: {text}\n".encode()
        self.flush()

    def flush(self) -> None:
        if not self.buf:
            return
        self.n += 1
        self.store.create(layout.log_chunk(self.run_id, self.worker, self.n), bytes(self.buf))
        self.buf.clear()
        self.first = None

    def pump(self, fd: int, stop: threading.Event) -> None:
        """Ship until EOF (every writer closed the pipe), or until `stop` once nothing more can come."""
        while not stop.is_set():
            timeout = FLUSH_SECONDS if self.first is None else max(0.0, self.first + FLUSH_SECONDS - time.monotonic())
            ready, _, _ = select.select([fd], [], [], timeout)
            if ready:
                data = os.read(fd, CHUNK_BYTES)
                if not data:
                    self._end()
                    return
                if self.quiet is not None:
                    data = self.quiet.feed(data)
                    if not data:
                        continue
                if self.first is None:
                    self.first = time.monotonic()
                self.buf += data
                if len(self.buf) >= CHUNK_BYTES:
                    self.flush()
            if self.first is not None and time.monotonic() - self.first >= FLUSH_SECONDS:
                self.flush()
        self._end()

    def _end(self) -> None:
        if self.quiet is not None:
            self.buf += self.quiet.end()
        self.flush()
