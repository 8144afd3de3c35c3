"""One attempt at one run on this host: check the package against its name, unpack it, install the job's
requirements into an environment of their own that sees the image's TensorFlow (jobenv.py), run the command with
the TPUCTL_* environment, ship its output (logshipper.py), and supervise it until it ends (supervisor.py); start
it again as `submit --max-restarts` says (restarts.py), and, for a run across hosts, together with every other host
(rounds.py). The status it writes is the run's status.json for this worker.

The agent itself being stopped (SIGTERM: systemd stopping it as the host shuts down for a reboot, maintenance or a
preemption; `tpuctl down` of a local cluster) is not a cancel: the job gets its SIGTERM and TPUCTL_STOP_GRACE
seconds to checkpoint, its output is shipped, and the attempt is recorded `interrupted`, which the next agent
resumes at once (claims.py). Only a user's `cancel`, the deadline, or the job's own exit end a run."""
from __future__ import annotations

import hashlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from ..core import knobs, layout, runs
from ..core.backends import keep_keras_3
from ..core.errors import TpuctlError
from ..core.lifecycle import Clock
from ..core.packaging import unpack
from ..core.runs import RunSpec, RunState, RunStatus
from ..runtime import RESTART_CODE, prefer_legacy_keras
from . import cordon, failures, heldoutput, jaxcluster, jobenv, kerasbackend, megascale, podruntime
from .contexts import Seat
from .doctor import Doctor, Stall
from .halts import Halts
from .heldoutput import HeldOutput
from .jobprocs import start
from .logshipper import LogShipper
from .preamble import PreambleFilter
from . import compilecache   # warm restarts: the job's JAX compilation cache
from .restarts import Decision, backoff, decide, wait_out
from .rounds import FINISHED, Called, Rounds
from .runevents import RunEvents
from .storeguard import StoreGuard
from .supervisor import Supervisor, Watch
from .tpuenv import pjrt_from_python, tpu_environment

# A job that died of SIGTERM or SIGKILL while the agent was not (yet) told to stop: how long to wait for the agent's
# own SIGTERM before calling it the job's failure. A host shutting down signals every process at once (systemd's
# default KillMode=control-group, then the shutdown's final SIGTERM to all), so the job may be first.
SIGNAL_WAIT_SECONDS = 2.0


class AttemptHost(Seat, Protocol):
    """What an attempt reads and calls of the agent that runs it (agent.py), beyond the host's seat."""
    home: Path                 # the agent's working directory: runs' code and environments
    slice: int                 # this host's slice of a Multislice cluster
    stop: threading.Event      # the agent is being stopped
    external_restarts: bool    # a GKE pod: the JobSet restarts the run, not this agent
    guard: StoreGuard          # the store's trouble, reported once and said in statuses
    held: HeldOutput           # ended runs' output the full store could not take yet
    clock: Clock               # the cluster's idleness, for autostop

    def write_status(self, run_id: str, st: RunStatus) -> None: ...

    def beat_if_quiet(self, running: str = "") -> None: ...

    def package_limits(self) -> tuple[int, int]: ...

    def tpu_address(self) -> str: ...

    def wait_tpu_address(self, heartbeat: Callable[[], None]) -> str: ...

    def idle_limit(self) -> str: ...


class Attempt:
    def __init__(self, agent: AttemptHost, run_id: str, attempt: int, job: RunSpec | None,
                 resumed_after_stop: bool, limit: Callable[[], str]) -> None:
        """`job`: the run's spec when the agent has read it; `resumed_after_stop`: the previous attempt was
        interrupted by its host's stop (claims.py); `limit`: why the cluster's own limit ends a running run now
        (autostop.py's run_limit)."""
        self.a, self.run_id, self.attempt, self.resumed_after_stop = agent, run_id, attempt, resumed_after_stop
        self.job = job or runs.job(agent.store, run_id)
        self.started = time.time()
        self.work = agent.home / "runs" / run_id / f"w{agent.worker}"
        self.code_dir = self.work / "code"
        # restarts spent by the attempts before this one (a host lost and replaced does not give them back)
        self.restarts = attempt - 1 if agent.external_restarts else \
            runs.status(agent.store, run_id, agent.worker).restarts if attempt > 1 else 0   # GKE: the JobSet's
        self.began = 0.0  # when the job's process last started (the restart backoff's measure of a healthy run)
        self.exited: int | None = None   # the exit code a restart on this host followed (its run.restarted says it)
        self.halts = Halts(agent.store, run_id, agent.stop, agent.guard.failed, limit,   # what ends it from outside
                           first=agent.worker == 0 and agent.slice == 0)
        self.events = RunEvents(agent.store, str(agent.record.get("cluster", "")), run_id, attempt, agent.worker,
                                agent.host, self.started)
        self.doctor: Doctor | None = None   # the stall check while the job runs (doctor.py)
        self.failure = ""                   # the cause of the last failed start (failures.py)
        self.tally = failures.Tally()

    def status(self, state: RunState, exit_code: int | None = None, pid: int | None = None, note: str = "",
               ended: float | None = None) -> None:
        """`ended`: a final status's end time, when it is written again (heldoutput.py)."""
        stalled = self.doctor.stalled if self.doctor else None
        self.a.write_status(self.run_id, RunStatus(state=state, exit_code=exit_code, pid=pid, started=self.started,
                                                   attempt=self.attempt, note=note, restarts=self.restarts,
                                                   ended=(ended or time.time()) if state.final else None,
                                                   stalled_since=stalled.since if stalled else None,
                                                   failure=self.failure))

    def run(self) -> int:
        """The job's exit code (127: the run could not be prepared; 130: cancelled before it started)."""
        if self.a.store.read(layout.run_cancel(self.run_id)) is not None:
            self.status(RunState.CANCELLED)   # cancelled while queued: it never starts
            return 130
        self.status(RunState.STARTING)
        shipper = self._shipper()
        try:
            job = prepare(self, shipper)
        except Exception as e:  # noqa: BLE001 - reported in the run's own log and status
            return unprepared(self, shipper, e)
        if self.a.stop.is_set() or self.tally.moved:   # stopped, or a GKE pod left its sick host (leave_if_sick)
            return self._interrupted(shipper, RESTART_CODE if self.tally.moved else None, self.tally.moved)
        tf = kerasbackend.tensorflow_to_install(job, self.a.record, self.a.accelerator)
        script, env_dir = job_script(self, job, tf)
        rounds = Rounds.of(self.a, self.a.stop, self.run_id, job)
        n = rounds.join() if rounds else 1
        self.doctor = Doctor(self.a, self.run_id, job, self.attempt, self.work / "stacks")
        wait = 0.0   # the restart backoff (restarts.backoff)
        while True:
            if rounds:
                n, why_not = rounds.assemble(n, lambda note: self.status(RunState.STARTING, note=note),
                                             self.halts.halted)
                if why_not:
                    return self._not_started(shipper, rounds, n, why_not)
                self.restarts = rounds.restarts(n)
            env = environment(self.a, self.run_id, job, tf, env_dir)
            env.update(TPUCTL_RESTARTS=str(self.restarts), TPUCTL_STACKS_DIR=self.doctor.fresh_stacks_dir())
            proc = self._launch(script, env, shipper)
            if isinstance(proc, int):
                return proc
            self.events.started(self.restarts, n, self.exited)
            supervisor = self._supervisor(proc, shipper, rounds, n)
            rc, cancelled = supervisor.run()
            if not cancelled and rc != 0 and self._host_stopping(rc, supervisor.signalled_it()):
                return self._interrupted(shipper, rc)   # the host's stop: never a restart, never the run's end
            if supervisor.stalled and not rounds:
                ended, wait = after_stall(self, shipper, supervisor.stalled, rc, job, wait)
                if ended is not None:
                    return ended
                continue
            if later := supervisor.superseded or lost_host(self, rounds, n, rc, cancelled):
                n, ended = self._next_round(shipper, *later, rc=rc)
                if ended is not None:
                    return ended
                continue
            decision = triage(self, rc, cancelled, job, shipper)
            if self.tally.moved:   # a GKE pod on a sick host, its node cordoned: the JobSet restarts it elsewhere
                return self._interrupted(shipper, RESTART_CODE, self.tally.moved)
            if decision is Decision.RESTART and rounds:
                n = int(rounds.call(n + 1, f"{rounds.label(self.a.worker)}'s job exited {rc}",
                                    counts=not self.tally.free)["round"])
                shipper.note(f"the job exited {rc}: the run restarts on every host (round {n}; submit "
                             f"--max-restarts {job.max_restarts})", fresh_line=True)
                continue
            if decision is Decision.RESTART:
                wait = backoff(wait, time.monotonic() - self.began)
                ended = self._restart(shipper, rc, job.max_restarts, wait)
                if ended is not None:
                    return ended
                continue
            if decision is Decision.FAIL and rounds:
                rounds.call(n + 1, f"its job exited {rc}", end="failed", exit_code=rc)
            if decision is Decision.DONE and rounds:
                later, why_not = rounds.finish(n, lambda note: self.status(RunState.RUNNING, note=note),
                                               self.halts.halted)
                if why_not:
                    return self._not_started(shipper, rounds, n, why_not)
                if later:
                    n, ended = self._next_round(shipper, *later)
                    if ended is not None:
                        return ended
                    continue
            break
        # RESUME: tpuctl itself ended the job (a cancel, the deadline): cancelled. The agent's own stop returned above
        state = {Decision.DONE: RunState.SUCCEEDED, Decision.FAIL: RunState.FAILED}.get(decision, RunState.CANCELLED)
        return self._end(shipper, state, rc, cancelled, runs.cancelled_by(self.a.store, self.run_id) * cancelled)

    def _shipper(self) -> LogShipper:
        """The run's log on this host, which says first why a later attempt took the run over."""
        quiet = None if self.job is not None and self.job.env.get("TPUCTL_TF_PREAMBLE") == "1" else \
            PreambleFilter(gpu=self.a.accelerator.startswith("gpu"))
        shipper = LogShipper(self.a.store, self.run_id, self.a.worker, quiet, self.a.guard)
        if self.attempt > 1:
            why = "the previous attempt's host stopped" if self.resumed_after_stop \
                else "the previous host stopped heartbeating"
            shipper.note(f"{why}; run resumed on {self.a.host} (attempt {self.attempt})", fresh_line=True)
        return shipper

    def _end(self, shipper: LogShipper, state: RunState, rc: int, cancelled: bool, why: str = "") -> int:
        """The run's end on this host: its output shipped, its final status, its event."""
        if why:
            shipper.note(why, fresh_line=True)
        ship_cache(self, shipper)
        shipper.flush(last=True)
        note = why or self.halts.limit   # a run the cluster's limit ended says which (the supervisor logged it)
        if shipper.buf and not self.a.stop.is_set():
            # the store is full: the run ends now, the queue moves on, and its held output follows (heldoutput.py)
            end = time.time()
            self.status(state, rc, note=heldoutput.waiting(shipper), ended=end)
            self.a.held.drain(shipper, lambda said: self.status(state, rc, note=said or note, ended=end))
        else:
            shipper.settle(self.a.stop, lambda _: None)   # nothing held, or the agent stops: what is lost is marked
            lost = f"{shipper.unshipped} bytes of output were not shipped ({self.a.guard.problem or 'store full'})"
            self.status(state, exit_code=rc, note=lost if shipper.unshipped else note)
        self.events.ended(rc, cancelled, self.failure if state in (RunState.FAILED, RunState.STALLED) else "")
        return rc

    def _watch(self) -> Watch:
        """What the supervisor of this attempt's job reads and calls (supervisor.py)."""
        a = self.a
        return Watch(self.run_id, a.stop, self.halts, lambda pid: self.status(RunState.RUNNING, pid=pid),
                     a.clock.busy, a.beat_if_quiet, a.guard.failed, a.idle_limit)

    def _next_round(self, shipper: LogShipper, why: str, called: dict[str, Any],
                    rc: int | None = None) -> tuple[int, int | None]:
        """A later round another host (or this one's watch) asked for: (the round, None) to start it, or (0, the
        exit code) when it ends the run (rounds.py); a round that ends the run for a stall ends it `stalled`, with
        this host's job's own exit code `rc`."""
        self.failure = "stalled" if called.get("stalled") else "lost-host" if not (called.get("counts") or
                                                                                   called.get("end")) else self.failure
        if called.get("end") == "stalled":
            return 0, self._end(shipper, RunState.STALLED, 143 if rc is None else rc, False, why)
        if called.get("end"):
            return 0, self._end(shipper, RunState.FAILED, int(called.get("exit_code") or 1), False, why)
        shipper.note(f"{why}: the run restarts on every host (round {called['round']})", fresh_line=True)
        return int(called["round"]), None

    def _launch(self, script: str, env: dict[str, str], shipper: LogShipper) -> subprocess.Popen[bytes] | int:
        """The job's process (jobprocs.start), or the run's end (its exit code): cancelled before it (re)started, or
        failed at once when it cannot be started (a NUL byte or an entry over the kernel's limit that an older
        tpuctl's submit let through, or E2BIG)."""
        self.cache_env = env
        ship_cache(self, shipper)   # what the job's last start compiled, for a host made again (compilecache.py)
        if self.halts.cancel_asked():   # before the first start and before every restart: a cancel wins at once
            return self._end(shipper, RunState.CANCELLED, 130, True, "cancelled: the job is not started again")
        self.began, self.tally.oom_before = time.monotonic(), failures.oom_kills()
        try:
            return start(script, self.code_dir, env)
        except (OSError, ValueError) as e:
            return self._end(shipper, RunState.FAILED, 127, False, f"cannot start the job: {type(e).__name__}: {e}")

    def _supervisor(self, proc: subprocess.Popen[bytes], shipper: LogShipper, rounds: Rounds | None,
                    n: int) -> Supervisor:
        """The started job's supervisor, with the run doctor watching it (a stall in a run across hosts is a
        round: Rounds.for_stall)."""
        assert self.doctor is not None
        self.doctor.begin()
        return Supervisor(self._watch(), proc, shipper, (lambda: rounds.watch(n)) if rounds else None, self.doctor,
                          lambda: self.restarts, (lambda s: rounds.for_stall(n, s.why, s.action)) if rounds else None)

    def _restart(self, shipper: LogShipper, rc: int, limit: int, wait: float, what: str = "") -> int | None:
        """A restart on this host after `wait` seconds (restarts.backoff), said in the log: None to start the job
        again, or the exit code when a cancel, the cluster's limit or the agent's stop came during the wait. The
        restart counts once the wait is over, and a run ended during it keeps the job's own last exit code: one
        cancelled there counted a restart that never ran and showed exit 130, tpuctl's "interrupted" (issue 52.7)."""
        n = self.restarts + (not self.tally.free)   # a TPU's failure (failures.py) is not counted
        self.exited = rc
        shipper.note(f"{what or f'the job exited {rc}'}; " + (f"restart {n} of {limit} (submit --max-restarts)"
                     if not self.tally.free else "restarted, not counted") + f", from its checkpoint, in {wait:g}s "
                     "(the wait doubles while the job keeps failing, up to a minute)", fresh_line=True)
        why = wait_out(wait, self.a.stop, self.halts.why_not_restart,
                       lambda left: self.status(RunState.RUNNING, note=f"restart {n} in {left:.0f}s"))
        if why and self.a.stop.is_set():
            return self._interrupted(shipper, rc)
        if why:
            return self._end(shipper, RunState.CANCELLED, rc, True, why)
        self.restarts = n
        return None

    def _not_started(self, shipper: LogShipper, rounds: Rounds, n: int, why: str) -> int:
        """A round that could not start on this host: the agent's stop, a cancel, or a run that ended elsewhere."""
        if why != "halted":   # FINISHED: every host had finished the run before this one's restart (rounds.assemble)
            code = 0 if why == FINISHED else int((rounds.called(n) or {}).get("exit_code") or 1)
            return self._end(shipper, RunState.SUCCEEDED if why == FINISHED else RunState.FAILED, code, False, why)
        if self.a.stop.is_set():
            return self._interrupted(shipper, None)
        limit = self.halts.limit
        return self._end(shipper, RunState.CANCELLED, 130, True,
                         f"{limit}: ending the run" if limit else "cancelled while waiting for every host")

    def _host_stopping(self, rc: int, superseded: bool) -> bool:
        """Whether the job's end is the host's stop: the agent is being stopped, or the job died of a signal and the
        agent's own SIGTERM follows within SIGNAL_WAIT_SECONDS (a job that saved and exited 143 reads the same). A
        job tpuctl ended itself (`superseded`: a new round, rounds.py, or a stall, doctor.py) was signalled by
        tpuctl: only the agent's stop counts then; a cancel or the budget never asks (no wait for the SIGTERM)."""
        if superseded:
            return self.a.stop.is_set()
        if self.a.external_restarts and self.job is not None and \
                decide(rc, False, self.restarts, self.job.max_restarts) is Decision.RESTART:
            return True   # a GKE pod: the JobSet restarts every pod on this code (the Job's pod failure policy)
        killed = rc in (128 + signal.SIGTERM, 128 + signal.SIGKILL)
        return self.a.stop.is_set() or (killed and self.a.stop.wait(SIGNAL_WAIT_SECONDS))

    def _interrupted(self, shipper: LogShipper, rc: int | None, moved: str = "") -> int:
        """The agent is being stopped: not the run's end. Recorded `interrupted` (with what the job exited with), so
        the next agent on this host or on its replacement resumes it at once (claims.py). `moved`: a GKE pod leaves
        its sick host's cordoned node (cordon.py), exiting `rc` for the JobSet's restart."""
        why = f"the agent was stopped on {self.a.host} (the host shutting down, maintenance or a preemption)"
        self.failure = "preempted" if self.a.stop.is_set() else self.failure
        if moved:
            why = moved
        elif self.a.external_restarts and not self.a.stop.is_set():   # a GKE pod's job exited for a JobSet restart
            why = f"the job exited {rc}" + (" (stalled)" if self.failure == "stalled" else "") + \
                ": the JobSet restarts the run"
        shipper.note(f"{why}; the run resumes when an agent starts again", fresh_line=True)
        ship_cache(self, shipper)
        shipper.flush(last=True)
        self.status(RunState.INTERRUPTED, exit_code=rc, note=why)
        return 128 + signal.SIGTERM if rc is None else rc


def after_stall(at: Attempt, shipper: LogShipper, stall: Stall, rc: int, job: RunSpec,
                wait: float) -> tuple[int | None, float]:
    """A job on one host ended for a stall (doctor.py): a restart (None: start it again), or the run's end as
    `stalled` (its exit code); and the restart backoff's wait. A GKE pod leaves the restart to its JobSet: it
    exits with the job's code, which the pod failure policy restarts (restarts.py)."""
    at.failure = "stalled"
    if stall.action == "restart" and at.a.external_restarts:
        return at._interrupted(shipper, rc), wait
    if stall.action == "restart":
        wait = backoff(wait, time.monotonic() - at.began)
        return at._restart(shipper, rc, job.max_restarts, wait, "the run stalled"), wait
    return at._end(shipper, RunState.STALLED, rc, False,
                   f"the run stalled ({stall.why}): ended (submit --on-stall {job.on_stall}"
                   + (f", --max-restarts {job.max_restarts} spent" if job.on_stall == "restart" else "") + ")"), wait


def triage(at: Attempt, rc: int, cancelled: bool, job: RunSpec, shipper: LogShipper) -> Decision:
    """restarts.decide, after the failure's cause (failures.py), said in the log: an OOM is never restarted; a TPU
    busy or missing is restarted once, not counted, after its lockfile is cleared, and a second time on this host
    marks the host sick and fails the run."""
    decision = decide(rc, cancelled, at.restarts, job.max_restarts)
    at.tally.free = False
    if cancelled or rc == 0:
        return decision
    oom = at.tally.oom_before >= 0 and failures.oom_kills() > at.tally.oom_before
    f = failures.classify(rc, bytes(shipper.tail).decode(errors="replace"), oom)
    at.failure = f.cause
    said = f"the job failed ({f.cause}" + (f": {f.line}" if f.line else "") + f"): {f.hint}"
    if f.restartable is True:
        at.tally.device += 1
        if at.tally.device > 1:
            failures.mark_sick(at.a.store, at.a.host, at.a.worker, said)
            if at.a.external_restarts:   # a GKE pod: its node cordoned, the run restarted on another (cordon.py)
                moved, why = cordon.leave(at.a.store, at.a.host, said)
                shipper.note(f"{said}; a second time on {at.a.host}: the host is marked sick; {why}", fresh_line=True)
                at.tally.moved = why if moved else ""
                return Decision.RESUME if moved else Decision.FAIL
            waits = at.tally.device <= failures.SICK_RESTARTS and failures.replaced_by_watcher(at.a.store)
            shipper.note(f"{said}; a second time on {at.a.host}: the host is marked sick" + (
                "; the recovery watcher replaces it and the run resumes there (meanwhile it restarts here, not "
                "counted)" if waits else ""), fresh_line=True)
            at.tally.free = waits
            return Decision.RESTART if waits else Decision.FAIL
        shipper.note(f"{said}; {failures.clear_lockfile()}", fresh_line=True)
        at.tally.free = True
        return Decision.RESTART
    if f.cause != "job" or f.line:   # the job's own error says itself in its log: a note would add nothing
        shipper.note(said, fresh_line=True)
    return Decision.FAIL if f.restartable is False else decision


def unprepared(at: Attempt, shipper: LogShipper, e: Exception) -> int:
    """The run could not be prepared (prepare): the agent's stop, or the run's end, said in its log (127)."""
    if at.a.stop.is_set():
        return at._interrupted(shipper, None)
    shipper.note(f"cannot prepare the run: {with_hint(e)}")
    at.status(RunState.FAILED, exit_code=127)
    at.events.ended(127, False)
    return 127


def leave_if_sick(at: Attempt, shipper: LogShipper) -> bool:
    """A GKE pod whose host is marked sick (by another host's run doctor: a stall alone, twice, doctor.py): its node
    cordoned before anything is installed (cordon.py), at.tally.moved saying it; the pod then exits for the JobSet to
    restart the run elsewhere. False when the host is not marked, or its node could not be cordoned (said)."""
    sick = cordon.sick_here(at.a.store, at.a.host) if at.a.external_restarts else ""
    if not sick:
        return False
    moved, said = cordon.leave(at.a.store, at.a.host, sick)
    shipper.note(f"{at.a.host} is marked sick ({sick}): {said}", fresh_line=True)
    at.tally.moved = f"{at.a.host} is marked sick: {said}" if moved else ""
    return moved


def prepare(at: Attempt, shipper: LogShipper) -> RunSpec:
    """The run's package checked and unpacked, its slice's settings checked, a legacy node's address awaited; a GKE
    pod on a host marked sick leaves first (leave_if_sick: the job returned unprepared, at.tally.moved set)."""
    job, a = at.job, at.a
    knobs.check()   # the agent's TPUCTL_* waits, read later as the job runs: a bad one ends the run here, said
    if job is None:
        raise RuntimeError(f"{layout.run_job(at.run_id)} is unreadable")
    if leave_if_sick(at, shipper):
        return job
    pkg = a.store.read(layout.job_package(job.package))
    if pkg is None:
        raise RuntimeError(f"package {job.package} is missing from the store")
    if hashlib.sha256(pkg).hexdigest() != job.package:
        raise RuntimeError(f"package {job.package} does not match its sha256 name")
    unpack(pkg, at.code_dir, *a.package_limits())
    megascale.check(megascale.read(a.record), a.slice)
    if a.record.get("arch") == "node" and not a.tpu_address():
        shipper.note("waiting for the TPU node's address (tpuctl up writes it once the node is READY)")
        if not a.wait_tpu_address(lambda: at.status(RunState.STARTING)):
            raise RuntimeError("the TPU node's address never appeared in the cluster record")
    return job


def job_script(at: Attempt, job: RunSpec, tf: str) -> tuple[str, Path | None]:
    """The job's bash script, and its own environment when it needs one (requirements, TensorFlow `tf`, or
    JAX for a Keras job where the image has none); a Keras job's backend said first."""
    a = at.a
    script = "set -e\n" + kerasbackend.said(job, a.record, a.accelerator)
    jax = kerasbackend.jax_to_install(job, a.record, a.accelerator)
    env_dir = None
    if job.requirements or tf or jax:
        env_dir, make = jobenv.plan(a.home, at.code_dir, job.requirements, at.work, tf, jax,
                                    pjrt_from_python(tf, a.record, job.env))
        script += make
    if tf and env_dir and podruntime.applies(a.record, kerasbackend.framework(job, a.record, a.accelerator)):
        script += shlex.join(podruntime.command(a.store.uri, at.run_id, at.attempt, a.workers, a.host,
                                                str(env_dir / "bin" / "python"))) + "\n"
    # As written, through bash: `prepare && train`, `cd sub && ...`, `VAR=1 python ...` all work; arguments
    # after `--` are appended shell-quoted (to the last command of a list).
    return script + "set +e\n" + job.command + "".join(" " + shlex.quote(x) for x in job.args) + "\n", env_dir


def environment(a: AttemptHost, run_id: str, job: RunSpec, tf: str = "", env_dir: Path | None = None) -> dict[str, str]:
    """The job's environment: the agent's, the job's own, the TPUCTL_* variables and its framework's."""
    env = dict(os.environ)
    env.update(job.env)
    out = a.store.local_path(layout.run_output(run_id))
    data = a.store.local_path(layout.run_data(run_id).rstrip("/"))
    if not out.startswith("gs://"):
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(data).mkdir(parents=True, exist_ok=True)   # there even when the run has no data
    # where libtpu comes with the TensorFlow installed for the job; the script then points at the libtpu Python
    # actually finds (jobenv.pjrt_library: the image's, when one outside the environment satisfied pip)
    libtpu = str(jobenv.purelib(env_dir) / "libtpu" / "libtpu.so") if tf and env_dir else ""
    framework_env = tpu_environment(kerasbackend.framework(job, a.record, a.accelerator), a.record, a.accelerator,
                                    libtpu)
    framework_env.update(kerasbackend.environment(job, a.record, a.accelerator))
    framework_env.update(megascale.environment(a.record, a.slice, megascale.read(a.record)))
    framework_env.update(jaxcluster.environment(a.record, a.worker, a.workers))
    framework_env.update(compilecache.environment(a.home, a.store, job, env_dir))   # warm restarts
    env.update(TPUCTL_RUN_ID=run_id, TPUCTL_STORE=a.store.uri, TPUCTL_DATA_DIR=data, TPUCTL_OUTPUT_DIR=out,
               TPUCTL_ACCELERATOR=a.accelerator, TPUCTL_TPU=framework_env.get("TPU_NAME", a.tpu_address()),
               TPUCTL_WORKER=str(a.worker), TPUCTL_NUM_WORKERS=str(a.workers), PYTHONUNBUFFERED="1")
    for k, v in framework_env.items():
        if k not in job.env:   # a job's own value wins
            env[k] = v
    _which_keras(env, job, tf)
    # `python` in a job's command means the agent's own interpreter (its venv has the agent's packages).
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env

def with_hint(e: Exception) -> str:
    """An error as the run's log says it: a TpuctlError's hint too (a bad TPUCTL_* knob: what to set)."""
    return f"{e} ({e.hint})" if isinstance(e, TpuctlError) and e.hint else str(e)


def lost_host(at: Attempt, rounds: Rounds | None, n: int, rc: int, cancelled: bool) -> Called | None:
    """A job across hosts that exited on its own: a lost host's doing, or None (rounds.lost_since)."""
    return rounds.lost_since(n, rc, cancelled, lambda note: at.status(RunState.RUNNING, note=note),
                             at.halts.halted) if rounds else None


def _which_keras(env: dict[str, str], job: RunSpec, tf: str) -> None:
    """tf.keras as the job needs it: a Keras 3 job gets Keras 3 (no inherited TF_USE_LEGACY_KERAS); a TensorFlow job
    gets tf-keras where it is installed (beside a TensorFlow installed for it, as Google's harness does)."""
    if job.framework == "keras":
        keep_keras_3(env, job.env)
        return
    if tf:
        env.setdefault("TF_USE_LEGACY_KERAS", "1")
    prefer_legacy_keras(env)


def ship_cache(at: Attempt, shipper: LogShipper) -> None:
    """Worker 0's compile cache to the store when the job's last start added to it (compilecache.ship)."""
    compilecache.ship(at.a.store, at.a.home, getattr(at, "cache_env", {}), at.a.worker,
                      lambda said: shipper.note(said, fresh_line=True))
