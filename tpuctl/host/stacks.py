"""Every process of a stalled job, as text: its process tree with each process's state and wait channel (what the
kernel says it waits in), then each Python process's threads' stacks.

How the stacks are taken, and why not with py-spy first: py-spy attaches with ptrace, which a container without
SYS_PTRACE refuses (GKE drops it: "Permission Denied: Try running again with elevated permissions", benfred/py-spy
README) and which stops every thread of the target while it samples, unless --nonblocking (py-spy#65, #872). A job
that imports tpuctl.runtime instead registers CPython's faulthandler on SIGUSR1 (runtime/stacks.py), writing every
thread's stack to its own file in TPUCTL_STACKS_DIR; the agent sends the signal and reads the file: no ptrace, no
pause, nothing to install, in any container. faulthandler says file, function and line, newest first, up to 100
frames and 100 threads (docs.python.org/3/library/faulthandler.html). A process is signalled only when its file is
there and /proc/PID/status shows SIGUSR1 caught (SigCgt): SIGUSR1 kills a process with no handler (Popen.returncode -10,
checked on Linux). A Python process without the handler gets `py-spy dump --nonblocking` where
py-spy is installed and permitted; anything else (not Python, or no way in) is said with its wait channel only."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ..core import knobs

SIGNAL = signal.SIGUSR1
PY_SPY_SECONDS = 10.0


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int]:
    """(state, parent pid) from /proc/PID/stat (comm may hold spaces and parentheses: split after its last ')')."""
    text = _read(f"/proc/{pid}/stat")
    try:
        fields = text.rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (IndexError, ValueError):
        return "?", 0


def command(pid: int) -> str:
    cmd = _read(f"/proc/{pid}/cmdline").replace("\0", " ").strip().replace("\n", "\\n")   # one line a process
    return cmd[:200] or _read(f"/proc/{pid}/comm").strip()


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` (the SigCgt mask in /proc/PID/status, bit sig-1)."""
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def tree(pids: list[int]) -> str:
    """The processes as a tree (by parent), each with its state and wait channel."""
    info = {p: _stat(p) for p in pids}
    kids: dict[int, list[int]] = {}
    for p, (_, ppid) in info.items():
        kids.setdefault(ppid if ppid in info else 0, []).append(p)
    lines: list[str] = []

    def walk(p: int, depth: int) -> None:
        state, _ = info[p]
        wchan = _read(f"/proc/{p}/wchan").strip() or "-"
        lines.append(f"{'  ' * depth}{p} [{state} wchan={wchan}] {command(p)}")
        for k in sorted(kids.get(p, [])):
            walk(k, depth + 1)
    for root in sorted(kids.get(0, [])):
        walk(root, 0)
    return "\n".join(lines)


def _python(pid: int, where: Path | None) -> bool:
    """A Python process: it registered its stacks file (runtime/stacks.py), or its executable is a python (a
    console script's comm is the script's name, its exe the interpreter)."""
    if where is not None and (where / f"{pid}.txt").exists():
        return True
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        exe = ""
    return "python" in exe or "python" in _read(f"/proc/{pid}/comm")


def _faulthandler(pid: int, where: Path, wait: float) -> str | None:
    """The process's threads through its faulthandler file, None when it registered none."""
    f = where / f"{pid}.txt"
    if not f.exists() or not catches(pid, SIGNAL):
        return None
    before = f.stat().st_size
    try:
        os.kill(pid, SIGNAL)
    except OSError:
        return None
    deadline, size, steady = time.monotonic() + wait, before, 0
    while time.monotonic() < deadline and steady < 3:   # written by the handler at once; wait for it to settle
        time.sleep(0.05)
        now = f.stat().st_size
        steady = steady + 1 if now == size and now > before else 0
        size = now
    with open(f, "rb") as fh:
        fh.seek(before)
        text = fh.read().decode(errors="replace")
    return text or None


def _py_spy(pid: int) -> str:
    exe = shutil.which("py-spy")
    if not exe:
        return "(no stack: the process did not import tpuctl.runtime, and py-spy is not installed)"
    try:
        done = subprocess.run([exe, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                              timeout=PY_SPY_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(py-spy dump failed: {type(e).__name__})"
    return done.stdout if done.returncode == 0 else f"(py-spy dump failed: {done.stderr.strip()[:300]})"


def dump(pids: list[int], where: Path | None) -> str:
    """The job's processes `pids` as text: the tree, then each Python process's stacks. `where`: the job's
    TPUCTL_STACKS_DIR."""
    pids = [p for p in dict.fromkeys(pids) if os.path.exists(f"/proc/{p}")]
    out = ["process tree (pid [state wchan=what the kernel waits in] command):", tree(pids) or "(no process)", ""]
    wait = knobs.number("TPUCTL_STACKS_WAIT", 3)
    for pid in pids:
        if not _python(pid, where):
            continue
        text = _faulthandler(pid, where, wait) if where is not None else None
        how = "faulthandler, through tpuctl.runtime"
        if text is None:
            text, how = _py_spy(pid), "py-spy dump --nonblocking"
        out += [f"--- pid {pid}: {command(pid)} ({how})", text.rstrip("\n"), ""]
    return "\n".join(out)
