"""The job's side of the run doctor's stack dumps (tpuctl/host/stacks.py): under tpuctl's agent (TPUCTL_STACKS_DIR
set), importing tpuctl.runtime registers CPython's faulthandler on SIGUSR1, writing every thread's stack to
TPUCTL_STACKS_DIR/<pid>.txt. The agent signals only processes whose file is there and whose SIGUSR1 is caught, so
a stalled job's stacks are taken without ptrace (a container without SYS_PTRACE) and without pausing it.

A job that handles SIGUSR1 itself keeps its handler: nothing is registered then (and a handler it installs later
replaces this one; the agent then falls back to py-spy or the process's wait channel)."""
from __future__ import annotations

import faulthandler
import os
import signal
from typing import IO

_armed: dict[int, IO[str]] = {}   # pid -> its open file: faulthandler writes to the descriptor, kept open here


def _arm() -> bool:
    """Register the handler once per process; True when this process's stacks can be asked for."""
    where = os.environ.get("TPUCTL_STACKS_DIR", "")
    sig = getattr(signal, "SIGUSR1", None)
    if not where or sig is None or not hasattr(faulthandler, "register") or os.getpid() in _armed:
        return os.getpid() in _armed
    try:
        if signal.getsignal(sig) not in (signal.SIG_DFL, None):
            return False   # the job's own
        f = open(os.path.join(where, f"{os.getpid()}.txt"), "a")
        faulthandler.register(sig, file=f, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return False   # no directory, or not from the main interpreter: no stacks, the job runs on
    _armed[os.getpid()] = f
    return True
