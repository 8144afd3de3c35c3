"""A started job, watched until it ends (attempt.py starts it): its output pumped to the log shipper, cancel and
the cluster's limits, a new round of a run across hosts (rounds.py), the agent's own stop, what the job left
running, the run's heartbeat."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from ..core import knobs, runs
from ..core.runs import stop_grace
from .contexts import Failed
from .doctor import Doctor, Stall
from .halts import Halts
from .jobprocs import JobProcesses
from .logshipper import LogShipper

HEARTBEAT_SECONDS = 5.0
T = TypeVar("T")
Later = tuple[str, dict[str, Any]]   # a later round asked for (rounds.py): why, its record


def _never() -> str:
    return ""


@dataclass(frozen=True)
class Watch:
    """What a supervisor reads and calls of its attempt and agent (attempt.py builds it)."""
    run_id: str
    stop: threading.Event              # the agent's: it is being stopped
    halts: Halts                       # a cancel, the cluster's limits
    running: Callable[[int], None]     # the run's status: running, as the job's pid
    busy: Callable[[], None]           # a run is active: autostop's idle clock starts again (core/lifecycle.py)
    agent_beat: Callable[[str], None]  # the agent's own heartbeat, when one is due, naming the run
    failed: Failed                     # a store error reported (storeguard.py)
    # why the cluster's idleness limit (autostop) ends a run that stalled and was only notified: "" while it does
    # not (autostop.py's idle_limit; a stalled run counts as idle once its action has run)
    idle_limit: Callable[[], str] = field(default=_never)


class Supervisor:
    """A started job, watched until it ends. The run ends when the job's main process ends. Whatever it left
    running (`tensorboard &`, `nohup ...`, a daemon that called setsid) may still hold its output: it gets `drain`
    seconds to finish writing, then it is ended too, so one job can never keep the agent, its heartbeats and the
    next runs waiting."""

    def __init__(self, watch: Watch, proc: subprocess.Popen[bytes], shipper: LogShipper,
                 rounds: Callable[[], Later | None] | None = None, doctor: Doctor | None = None,
                 restarts: Callable[[], int] = lambda: 0,
                 round_for_stall: Callable[[Stall], Later] | None = None) -> None:
        """`doctor`: the run's stall check (doctor.py); `restarts`: those spent so far; `round_for_stall`: a run
        across hosts asks every host's job to restart or stop for a stall through a new round (rounds.py)."""
        self.at, self.proc, self.shipper = watch, proc, shipper
        self.rounds = rounds   # a run across hosts: a new round asked for (rounds.py) stops the job here too
        self.superseded: Later | None = None
        self.doctor, self.restarts, self.round_for_stall = doctor, restarts, round_for_stall
        self.stalled: Stall | None = None   # the job was ended for a stall (restart or stop)
        # `tpuctl drill -c`'s request this start answered (halts.drill): the job is signalled as a preemption
        # would, and its end is the job's own (a restart counted against --max-restarts, as on the drill's own
        # local cluster; across hosts, a new round: attempt.py)
        self.drilled: dict[str, Any] | None = None
        stdout = proc.stdout
        assert stdout is not None, "Popen(stdout=PIPE) always sets it"
        self.stdout = stdout
        self.procs = JobProcesses(proc.pid, pipe_inode=os.fstat(stdout.fileno()).st_ino)
        self.stop_pump = threading.Event()
        self.pump = threading.Thread(target=shipper.pump, args=(stdout.fileno(), self.stop_pump), daemon=True)
        self.cancelled = False
        self.stopping = False   # the agent is being stopped: the job was told, the run is interrupted, not ended
        self.kill_at: float | None = None
        self.drain = knobs.number("TPUCTL_DRAIN_SECONDS", 10)
        self.main_ended: float | None = None
        self.left: list[int] = []
        self.last_beat = self.last_cancel_check = 0.0

    def run(self) -> tuple[int, bool]:
        """(exit code, cancelled)"""
        self.pump.start()
        self.at.running(self.proc.pid)
        self.last_beat = self.last_cancel_check = time.monotonic()
        while self.pump.is_alive() or self.proc.poll() is None:
            self.pump.join(0.1)
            self._step(time.monotonic())
        # The job's end seen by the loop's own poll, not a pass's: its pipe closes as it exits, so the pump can end
        # before the process is reaped, a pass polls it still running, and the loop's poll then finds it ended
        self._main_ended(time.monotonic())
        self.stdout.close()
        if self.left and self.left != [-1]:
            self.shipper.note(f"the job's main process ended; {len(self.left)} process(es) it left running still "
                              f"held its output after {self.drain:g}s and were ended "
                              f"(pids {', '.join(map(str, self.left))})", fresh_line=True)
        rc = self.proc.returncode
        if self.drilled is not None:
            # with the job's own record of its start as it ended (its saves, its proof of an exit at a checkpoint):
            # the job's next start, begun at once after this, writes phase.json afresh before the drill reads it
            drilled = {**self.drilled, "job": self.at.halts.job_doc()}
            self._guarded(lambda: self.at.halts.drilled(self.restarts(), drilled), "drill")
        return (rc if rc >= 0 else 128 - rc), self.cancelled

    def _step(self, now: float) -> None:
        if not self.stopping and self.at.stop.is_set():
            # The agent itself is being stopped: the job gets its SIGTERM and the grace to checkpoint (never
            # orphaned); a cancel already under way keeps its own, shorter or not, deadline.
            self.stopping = True
            self.procs.signal(signal.SIGTERM)
            self.kill_at = min(self.kill_at or now + stop_grace(), now + stop_grace())
        if not self.cancelled and now - self.last_cancel_check >= 1.0:
            self.last_cancel_check = now
            self._check_cancel(now)
        if self.doctor is not None and not (self.cancelled or self.stopping or self.superseded or self.stalled) \
                and self.main_ended is None:
            self._check_stall(now)   # at the doctor's own pace (doctor.poll): a window may be seconds in a test
        if self.proc.poll() is not None:
            self._main_ended(now)
        if self.main_ended is not None and not self.left and now - self.main_ended >= self.drain:
            self.left = self.procs.processes() or [-1]
            self.procs.signal(signal.SIGTERM)
            self.kill_at = min(self.kill_at or now + 2.0, now + 2.0)
        if self.kill_at and now >= self.kill_at:
            if self.drilled is not None and self.main_ended is None:
                self.drilled["killed"] = True   # still running at the grace's end
            self.procs.signal(signal.SIGKILL)
            self.kill_at = None
            if self.main_ended is not None:
                self.stop_pump.set()   # nothing of the job is left to write; stop reading whatever holds the pipe
        if now - self.last_beat >= runs.heartbeat_seconds():
            self.last_beat = now
            self.at.running(self.proc.pid)
            self.at.agent_beat(self.at.run_id)

    def _main_ended(self, now: float) -> None:
        """The job's main process is seen ended (once): a drill's answer says when (its "ended")."""
        if self.main_ended is None:
            self.main_ended = now
            if self.drilled is not None:
                self.drilled["ended"] = time.time()

    def _check_cancel(self, now: float) -> None:
        """A cancel written by `tpuctl cancel`, or the hard deadline, which ends the run like a cancel and then the
        compute (the agent's enforce, next tick); a new round; a stall (doctor.py)."""
        notified = self.doctor is not None and self.doctor.stalled is not None
        if not notified:
            self.at.busy()   # a stalled run is idle once its action (notify) has run: autostop's clock runs on
        deadline = self.at.halts.deadline()
        if deadline:
            self.at.halts.limit = deadline   # the run's status says it too (attempt.py's _end)
            self.shipper.note(f"{deadline}: ending the run", fresh_line=True)
        if deadline or self.at.halts.cancel_asked():   # a store outage reported there, read as no cancel
            self._cancel(now, knobs.number("TPUCTL_CANCEL_GRACE", 30))
        elif self.rounds and not self.stopping and not self.superseded:
            self.superseded = self._guarded(self.rounds, "rounds")
            if self.superseded:
                doctor, why = self.doctor, str(self.superseded[1].get("why"))
                if self.superseded[1].get("stalled") and doctor is not None:   # another host saw it stall
                    self._guarded(lambda: doctor.dump(self._pids(), why), "stacks")
                self.procs.signal(signal.SIGTERM)   # the job checkpoints in its grace, as when its host stops
                self.kill_at = now + stop_grace()
        if not (self.stopping or self.superseded or self.stalled) and self.drilled is None and self.main_ended is None:
            asked = self._guarded(lambda: self.at.halts.drill(self.restarts()), "drill")
            if asked:
                self._drill(now, asked)

    def _drill(self, now: float, asked: dict[str, Any]) -> None:
        """What a preemption delivers, as `tpuctl drill -c` asked: SIGTERM and SIGKILL after its grace, or SIGKILL
        alone (a lost host). Read at the once-a-second cancel check: a phase shorter than that may be over when the
        signal lands (the drill reports the phase the job was in)."""
        kill = asked.get("signal") == "kill"
        self.drilled = {"signal": "SIGKILL" if kill else "SIGTERM", "signalled": time.time(), "killed": kill,
                        "phase": self.at.halts.job_phase()}
        self.shipper.note(f"tpuctl drill: {self.drilled['signal']} to the job"
                          + ("" if kill else f", SIGKILL in {float(asked.get('grace') or 0):g}s"), fresh_line=True)
        self.procs.signal(signal.SIGKILL if kill else signal.SIGTERM)
        self.kill_at = None if kill else now + float(asked.get("grace") or stop_grace())

    def signalled_it(self) -> bool:
        """tpuctl signalled the job itself, for a new round, a stall or a drill (not the agent's stop)."""
        return bool(self.superseded or self.stalled or self.drilled)

    def _pids(self) -> list[int]:
        return [self.proc.pid] + self.procs.processes()

    def _check_stall(self, now: float) -> None:
        doctor = self.doctor
        assert doctor is not None
        # the job's processes only when a stall is seen (for its stacks): a scan of /proc, every process's open files
        # read, and this runs every pass of the loop (ten a second) while doctor.check looks every few seconds
        seen = self._guarded(lambda: doctor.check(self._pids, self.shipper.received, self.restarts()), "stall")
        if seen is None and doctor.stalled is not None and doctor.stalled.action == "notify" and \
                now - self.last_cancel_check < 0.1:   # once a cancel check (a second), not every pass
            idle = self.at.idle_limit() or ("submit --down: a stalled run counts as ended" if doctor.job.down_after
                                            else "")
            if idle:   # a stalled run, notified, is idle: autostop (or --down) ends it, then the compute
                seen = Stall(f"{doctor.stalled.why}; {idle}", doctor.stalled.since, "stop")
                self.shipper.note(f"{idle}: the stalled run ends", fresh_line=True)
        if seen is None:
            return
        if seen is doctor.stalled:
            self.shipper.note(f"the run stalled: {seen.why}; this host's stacks are in the store (`tpuctl logs "
                              f"RUN --stacks`); submit --on-stall: {seen.action}", fresh_line=True)
        if seen.action == "notify":
            return
        self.stalled = seen
        if self.round_for_stall is not None:
            self.superseded = self._guarded(lambda: self.round_for_stall(seen) if self.round_for_stall else None,
                                            "rounds")
        self.procs.signal(signal.SIGTERM)   # the job checkpoints in its grace, as when its host stops
        self.kill_at = now + stop_grace()

    def _guarded(self, check: Callable[[], T], what: str) -> T | None:
        try:
            return check()
        except Exception as e:  # noqa: BLE001 - a store outage must not end the supervision of a running job
            self.at.failed(e, f"run {self.at.run_id}'s {what} check")
            return None

    def _cancel(self, now: float, grace: float) -> None:
        self.cancelled = True
        self.procs.signal(signal.SIGTERM)
        self.kill_at = now + grace
