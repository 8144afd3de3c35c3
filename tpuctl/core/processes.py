"""Whether a process on this machine runs, by pid."""
from __future__ import annotations

import os


def running(pid: int) -> bool:
    """True while the process runs: not when gone, nor when it exited and is not yet reaped (a zombie, which `kill -0`
    still finds: a container's init may never reap what it inherits). Someone else's process counts as running. A
    process's cmdline reads empty while it is still exiting, so that is not the test."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):   # no /proc (macOS): as far as kill can tell
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
