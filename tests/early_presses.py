"""Ctrl-C at spread moments of a command's start (issue 58.5: "0 tracebacks in 200 early Ctrl-Cs"), shared by
tests/test_interrupt_at_start.py (a few dozen presses) and bench/bench_early_ctrl_c.py (the 200-press campaign).

Each press is a terminal's: the command starts in a process group of its own with SIGINT at its default (what a
shell gives a foreground job; a suite run as a script's background job would hand SIG_IGN on), and the SIGINT goes
to the whole group (a terminal's Ctrl-C signals the foreground process group: termios(3), ISIG), so a launcher
and whatever it execs or starts are hit alike. A press counts as answered when the command exits 130 with no
traceback, or dies of the SIGINT itself (the kernel's default action: nothing can be printed then); a command that
had already exited before the press was sent is "too late" and says nothing either way."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass


@dataclass
class Press:
    delay_s: float          # after the start (Popen's return) the SIGINT was sent
    sent: bool              # the command was still running when it was sent
    returncode: int
    stderr: str

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.stderr or "KeyboardInterrupt" in self.stderr or "Exception ignored" in self.stderr

    @property
    def answered(self) -> bool:
        """Ended by the press, quietly: exit 130, or killed by SIGINT."""
        return not self.traceback and self.returncode in (130, -signal.SIGINT)

    @property
    def lost(self) -> bool:
        """The press reached a running command and it went on to exit as if none came (no traceback either)."""
        return self.sent and not self.traceback and self.returncode not in (130, -signal.SIGINT)


def as_a_terminal_starts(argv: list[str], blocked: bool = False) -> list[str]:
    """argv started with SIGINT at its default, as a terminal starts a command (this suite may run with it ignored,
    which children inherit), and blocked too where `blocked` (as launcher/tpuctl starts tpuctl-python). GNU env's
    --default-signal and --block-signal (coreutils 8.31, which the launcher needs anyway) set both in the child;
    Popen's preexec_fn would run Python in a fork of a many-threaded test worker, where gRPC's fork handlers had the
    child die of SIGABRT before exec ("Epoll1Poller ... epoll_wait error: Bad file descriptor", conftest's
    tpuctl_at_a_terminal)."""
    return ["env", "--default-signal=INT", *(["--block-signal=INT"] if blocked else []), *argv]


def press(argv: list[str], delay_s: float, env: dict[str, str] | None = None, timeout_s: float = 60) -> Press:
    proc = subprocess.Popen(as_a_terminal_starts(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        time.sleep(delay_s)
        sent = proc.poll() is None
        if sent:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:   # it exited between poll and kill
                sent = False
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return Press(delay_s, sent, proc.returncode, err.decode(errors="replace"))


def campaign(argv: list[str], n: int, window_s: float, env: dict[str, str] | None = None) -> list[Press]:
    """n presses at moments spread evenly over [0, window_s) after the start."""
    return [press(argv, window_s * i / n, env) for i in range(n)]


def summary(presses: list[Press]) -> str:
    sent = [p for p in presses if p.sent]
    tracebacks = [p for p in sent if p.traceback]
    lost = [p for p in sent if p.lost]
    killed = sum(p.returncode == -signal.SIGINT and not p.traceback for p in sent)
    quiet = sum(p.returncode == 130 and not p.traceback for p in sent)
    return (f"{len(presses)} presses, {len(sent)} while running: {quiet} exit 130 quietly, {killed} killed by SIGINT, "
            f"{len(tracebacks)} tracebacks, {len(lost)} lost"
            + "".join(f"\n  at {p.delay_s * 1000:.0f} ms: rc {p.returncode}: {p.stderr.strip()[-600:]}"
                      for p in (tracebacks + [p for p in lost if p not in tracebacks])[:5]))
