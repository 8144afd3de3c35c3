"""A command run with a deadline that holds (nvidia-smi for the chip sampler and the local provider's GPU count, `ps`
where there is no /proc).

A command that hangs may hang for good (nvidia-smi in a stuck driver). subprocess.run's timeout is not enough: it
kills the child alone, so whatever the child started keeps running, holding its pipes, and then it waits,
unbounded, for the child it killed, which a process stuck in the driver (uninterruptible sleep) does not leave.
Here the command runs in a session of its own; at the deadline the whole process group is killed, what was read is
kept, the pipes are closed and the exit is waited for a moment only (a process that is not reaped then is left to
subprocess's own reaping of abandoned children). What is read is capped too: a 400,000-line answer was read whole
at every sample (issue 58.4)."""
from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

CAP = 1 << 20   # bytes read of each pipe at most: 64 GPUs' lines are a few KiB
_REAP_S = 1.0   # how long a killed group's leader is waited for


class Overran(Exception):
    """The command did not end within its deadline (its process group was killed): the message says so."""


@dataclass
class Ran:
    code: int | None   # None: its output passed the cap, and it was stopped there
    out: str
    err: str


def run_bounded(cmd: list[str], within: float, cap: int = CAP, knob: str = "") -> Ran:
    """`cmd` in a session of its own, its output read until it exits (a child it leaves holding the pipes does not
    keep the read going), `cap` bytes of each pipe at most, `within` seconds at most; then whatever is left of
    its process group is killed."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    end = time.monotonic() + within
    got: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
    code: int | None = None
    with selectors.DefaultSelector() as sel:
        for n, pipe in ((1, proc.stdout), (2, proc.stderr)):
            if pipe is not None:
                os.set_blocking(pipe.fileno(), False)
                sel.register(pipe, selectors.EVENT_READ, n)
        while sel.get_map() and max(map(len, got.values())) <= cap:
            exited = proc.poll() is not None   # read before: what it wrote before exiting is read below
            left = end - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(0 if exited else min(left, 0.05)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:   # a readiness that was not
                    continue
                if chunk:
                    got[key.data] += chunk
                else:
                    sel.unregister(key.fileobj)
            if exited and not any(sel.select(0)):   # it has exited and all it wrote is read
                break
    cut = max(map(len, got.values())) > cap
    if not cut:
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(max(0.0, end - time.monotonic()))
    with contextlib.suppress(OSError):   # what is left of its group: children holding the pipes, or all of it
        os.killpg(proc.pid, signal.SIGKILL)
    if code is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(_REAP_S)
    for pipe in (proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            pipe and pipe.close()
    if code is None and not cut:
        raise Overran(f"{cmd[0]} did not answer within {within:g}s" + (f" ({knob})" if knob else ""))
    return Ran(code, got[1][:cap].decode(errors="replace"), got[2][:cap].decode(errors="replace"))
