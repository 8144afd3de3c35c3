"""The agent's log shipping: a job's merged stdout/stderr as numbered chunks in the store, each written once.
Chunk numbers have no gaps (a follower reads 1, 2, 3, ... and waits at the first missing one), so a number is taken
only once its chunk is written. Output the store cannot take now is held, up to TPUCTL_LOG_HOLD_BYTES (8 MiB: its
latest bytes, the rest counted as dropped), and retried with backoff (storeguard.py).

Output is shipped as soon as it is read, at most one chunk per flush_seconds() (0.5 s) while it keeps coming: a
line after a quiet spell (often a job's last words before it is killed) leaves at once, and a chatty job costs at
most two writes a second. So a SIGKILL of the host (the agent gets no word) loses at most the output of its last
0.5 s plus one write's time, with a store that takes writes; on SIGTERM the agent ships all it holds before it exits
(attempt.py)."""
from __future__ import annotations

import os
import select
import threading
import time
from typing import Callable

from ..core import knobs, layout
from .preamble import PreambleFilter
from ..core.store import BlobStore
from .storeguard import StoreGuard

CHUNK_BYTES = 64 * 1024
LINGER_SECONDS = 0.05   # output after a quiet spell waits this long for the rest of its line (print writes the
                        # text and its newline apart) before it leaves
RETRY_MAX_SECONDS = 30.0
TAIL_BYTES = 64 * 1024   # the job's last output kept for the failure's cause (failures.py)


def flush_seconds() -> float:
    """The least time between two chunks while output keeps coming (TPUCTL_LOG_FLUSH_SECONDS, 0.5 s)."""
    return knobs.number("TPUCTL_LOG_FLUSH_SECONDS", 0.5)


def hold_bytes() -> int:
    return knobs.count("TPUCTL_LOG_HOLD_BYTES", 8 << 20)


class LogShipper:
    """Reads the child's merged output and writes it as chunks 000001.log, 000002.log, ... each written once."""

    def __init__(self, store: BlobStore, run_id: str, worker: int, quiet: PreambleFilter | None = None,
                 guard: StoreGuard | None = None) -> None:
        self.store, self.run_id, self.worker = store, run_id, worker
        self.quiet = quiet   # drops TensorFlow's start-up preamble from the job's output (preamble.py)
        self.guard = guard or StoreGuard(store)
        # a resumed run appends to the log its earlier attempt left
        self.n = len(store.list(layout.run_logs(run_id, worker)))
        self.buf = bytearray()
        # the pump thread appends the job's output while the supervising thread adds the agent's notes: one flush
        # at a time, or two could both take the next chunk number
        self.lock = threading.RLock()
        self.flush_every = flush_seconds()
        self.last = 0.0            # when a chunk was last written: the next may follow flush_every later
        self.first = 0.0           # when the oldest byte not yet shipped was read
        self.shipped = 0
        self.dropped = 0           # held output beyond the bound, never shipped
        self.retry_at = 0.0        # while the store refuses, when to try again
        self.backoff = 0.5
        self.received = 0          # bytes the job wrote: progress, for a job that reports no steps (stall.py)
        self.tail = bytearray()    # its last TAIL_BYTES as written (before the preamble filter): failures.py

    def note(self, text: str, fresh_line: bool = False) -> None:
        """A line of the agent's own into the run's log, in order with the job's output; fresh_line starts it on a
        new line when the log may end mid-line (an earlier attempt cut off)."""
        with self.lock:
            self.buf += f"{chr(10) if fresh_line else ''}tpuctl agent: {text}\n".encode()
            self.flush()

    @property
    def unshipped(self) -> int:
        return len(self.buf) + self.dropped

    def flush(self, last: bool = False) -> None:
        """Ship what is buffered, in chunks; what the store refuses stays buffered (bounded) for the next try,
        which comes after a backoff, or now when `last`."""
        with self.lock:
            self._flush(last)

    def _flush(self, last: bool) -> None:
        now = time.monotonic()
        if not self.buf or (now < self.retry_at and not last):
            return
        if self.dropped and self.retry_at:
            self.buf[:0] = (f"\ntpuctl agent: {self.dropped} bytes of output were dropped while the store "
                            f"refused writes ({self.guard.problem or 'store full'})\n").encode()
            self.dropped = 0
        while self.buf:
            piece = bytes(self.buf[:CHUNK_BYTES])
            try:
                if not self.guard.room_for_log(len(piece), self.shipped):
                    raise _Held()
                self.store.create(layout.log_chunk(self.run_id, self.worker, self.n + 1), piece)
            except Exception as e:  # noqa: BLE001 - the store refused: hold the output, try again later
                if not isinstance(e, _Held):
                    self.guard.failed(e, f"run {self.run_id}'s log")
                self._hold(now)
                return
            self.n += 1
            self.shipped += len(piece)
            del self.buf[:len(piece)]
            self.guard.wrote(log=True)
        self.last, self.retry_at, self.backoff = time.monotonic(), 0.0, 0.5

    def _trim(self) -> None:
        over = len(self.buf) - hold_bytes()
        if over > 0:
            del self.buf[:over]   # the latest output is kept: what a job printed last explains how it ended
            self.dropped += over

    def _hold(self, now: float) -> None:
        self._trim()
        self.retry_at = now + self.backoff
        self.backoff = min(self.backoff * 2, RETRY_MAX_SECONDS)

    def settle(self, stop: threading.Event, beat: Callable[[str], None]) -> None:
        """After the job's end, before the run's last status: what is held is tried again (with backoff, `beat`
        called meanwhile) until it is out, the agent stops, or TPUCTL_LOG_HOLD_WAIT seconds (300) pass; whatever
        could not go is then marked in the log itself, by a line small enough to pass the floor as a record does."""
        deadline = time.monotonic() + knobs.number("TPUCTL_LOG_HOLD_WAIT", 300)
        while self.unshipped and self.buf and not stop.is_set() and time.monotonic() < deadline:
            beat(f"the job ended; {self.unshipped} bytes of its output wait for the store "
                 f"({self.guard.problem or 'store full'})")
            stop.wait(min(max(0.05, self.retry_at - time.monotonic()), 5.0))
            self.flush(last=True)
        if not self.unshipped:
            return
        mark = f"\ntpuctl agent: {self.unshipped} bytes of output were not shipped " \
               f"({self.guard.problem or 'store full'})\n".encode()
        with self.lock:
            try:
                if self.store.create(layout.log_chunk(self.run_id, self.worker, self.n + 1), mark):
                    self.n += 1
            except Exception as e:  # noqa: BLE001 - the run's status says it too
                self.guard.failed(e, f"run {self.run_id}'s log")

    def pump(self, fd: int, stop: threading.Event) -> None:
        """Ship until EOF (every writer closed the pipe), or until `stop` once nothing more can come."""
        while not stop.is_set():
            due = self.retry_at or (self._due() if self.buf else None)
            timeout = self.flush_every if due is None else max(0.0, due - time.monotonic())
            ready, _, _ = select.select([fd], [], [], timeout)
            if ready:
                data = os.read(fd, CHUNK_BYTES)
                if not data:
                    self._end()
                    return
                self.received += len(data)
                self.tail += data
                del self.tail[:-TAIL_BYTES]
                if self.quiet is not None:
                    data = self.quiet.feed(data)
                    if not data:
                        continue
                with self.lock:
                    if not self.buf:
                        self.first = time.monotonic()
                    self.buf += data
                    if len(self.buf) >= CHUNK_BYTES:
                        self.flush()
                    if self.retry_at:
                        self._trim()
            if self.buf and time.monotonic() >= self._due():
                self.flush()
        self._end()

    def _due(self) -> float:
        return max(self.first + LINGER_SECONDS, self.last + self.flush_every)

    def _end(self) -> None:
        with self.lock:
            if self.quiet is not None:
                self.buf += self.quiet.end()
            self.flush(last=True)


class _Held(Exception):
    """The floor is reached: not an error of the store's, nothing to report but the hold."""
