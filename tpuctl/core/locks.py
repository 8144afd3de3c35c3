"""One `up` or `down` per cluster at a time on this machine: two at once would each undo what the other made.

A lock file per cluster under $TPUCTL_HOME/locks, held with flock for the command's lifetime (released by the
kernel if the process dies, so a killed command never leaves the cluster locked), and naming its holder so the
command that waits can say who it waits for.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from . import knobs, state
from .errors import bad_input


def _wait_seconds() -> float:
    return knobs.number("TPUCTL_LOCK_WAIT", 30)


@contextmanager
def cluster_lock(name: str, command: str, waiting: Callable[[str], None]) -> Iterator[None]:
    path = state.home() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + _wait_seconds()
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 500, 0).decode(errors="replace") or "another tpuctl command"
                if time.monotonic() >= deadline:
                    raise bad_input(f"cluster {name} is busy: {holder} is working on it",
                                    "wait for it to finish (or stop it), then run this again")
                if not told:
                    waiting(f"cluster {name} is busy: waiting up to {_wait_seconds():.0f}s for {holder}")
                    told = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"`tpuctl {command}` (pid {os.getpid()})".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
