"""Ending every process of a simulated machine at once, as a power-off or a stopped container does.

A machine's processes are found by a variable in their environment (`NAME=value`), set where the machine starts
its first process and inherited by everything it starts: neither a process group nor a session holds them all,
since tpuctl starts jobs in sessions of their own (host/jobprocs.py, host/session.py `stream`)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def marked(name: str, value: str) -> list[int]:
    """Live processes whose environment holds `name=value` (a zombie's environ reads empty, so it is not one)."""
    marker, found = f"{name}={value}".encode(), []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def kill_marked(name: str, value: str, wait: float = 0.0) -> None:
    """SIGKILL to every process with `name=value` in its environment; with `wait`, up to that many seconds until
    none is left alive (a signal is delivered when the process is next scheduled, so a busy one may still write
    for a moment after kill() returned)."""
    deadline = time.monotonic() + wait
    while True:
        pids = marked(name, value)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not pids or time.monotonic() >= deadline:
            return
        time.sleep(0.01)
