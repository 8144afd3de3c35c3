"""A running job's processes as the agent sees them: to signal, end, and find what a job or a dead agent left."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator


def start(script: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The job: `bash -c SCRIPT` as a session of its own, output merged into one pipe. bash is run by the path the
    agent finds it at, so an [env] PATH cannot hide it (issue 38.3: the run stayed `starting` for ever); the job's
    own commands follow its PATH (one not found exits 127, bash's word for it in the log)."""
    return subprocess.Popen([shutil.which("bash") or "bash", "-c", script], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


class JobProcesses:
    """A job's processes: its main process, started as a new session (so its session id is its pid), everything
    in that session, and what escaped the session (setsid, start_new_session=True) but still holds the job's output
    pipe, found by the pipe's inode in /proc/PID/fd (Linux, as TPU VMs are). With `run_id`, only a session whose
    processes carry TPUCTL_RUN_ID=run_id counts (a pid from an old status.json may belong to someone else now)."""

    def __init__(self, pid: int, pipe_inode: int | None = None, run_id: str = "") -> None:
        self.pid, self.run_id = pid, run_id
        self.pipe = f"pipe:[{pipe_inode}]" if pipe_inode is not None else ""

    def processes(self) -> list[int]:
        found = []
        for pid, state, session in _others():
            if state not in ("Z", "X") and session == self.pid:
                found.append(pid)
                continue
            try:
                if self.pipe and any(os.readlink(f"/proc/{pid}/fd/{fd}") == self.pipe
                                     for fd in os.listdir(f"/proc/{pid}/fd")):
                    found.append(pid)
            except OSError:
                continue   # gone meanwhile, or not ours to read
        if self.run_id and not any(f"TPUCTL_RUN_ID={self.run_id}".encode() in _environ(p) for p in found):
            return []
        return found

    def signal(self, sig: int) -> None:
        """Each process once. The main process is in its own session, so processes() finds it too: sent twice, a
        SIGTERM could reach a job's handler twice (bash -c execs its last command, so the main process is the job
        itself), and a second SIGTERM arriving inside the first handler cuts its output off mid-line and starts it
        again: `saved atsaved at 3` (issue 38.10; two kills in a row are coalesced only when the first is still
        pending, hence 1 run in 14)."""
        for pid in dict.fromkeys(([] if self.run_id else [self.pid]) + self.processes()):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def end(self, grace: float) -> None:
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.signal(signal.SIGKILL)


def started_for(run_id: str, worker: int) -> list[JobProcesses]:
    """The job sessions this machine runs for `run_id` on `worker` (their environment says so: attempt.py sets
    TPUCTL_RUN_ID and TPUCTL_WORKER), for a predecessor killed before it recorded its job's pid."""
    want = {f"TPUCTL_RUN_ID={run_id}".encode(), f"TPUCTL_WORKER={worker}".encode()}
    return [JobProcesses(pid, run_id=run_id) for pid, state, session in _others()
            if session == pid and state not in ("Z", "X") and want <= _environ(pid)]


def _others() -> Iterator[tuple[int, str, int]]:
    """(pid, state, session) of every process but this one (Linux /proc/PID/stat: `pid (comm) state ppid pgrp
    session ...`, comm may hold spaces and parentheses: split after its last ')')."""
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            yield int(d), fields[0], int(fields[3])
        except (OSError, IndexError, ValueError):
            continue   # gone meanwhile


def _environ(pid: int) -> set[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return set(f.read().split(b"\0"))
    except OSError:
        return set()   # gone meanwhile, or not ours to read
