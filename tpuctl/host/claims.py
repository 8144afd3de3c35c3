"""Which run this host takes next. A new run is claimed once, by create-if-absent on its claim object, so two
agents never run it both. A run whose host stopped heartbeating (a preempted or deleted TPU VM: `tpuctl up`
recreates it) is taken over by the next attempt's claim, same run id and output dir, so a job that checkpoints
continues; a run whose attempt its host's stop interrupted (attempt.py) is taken over at once. After MAX_ATTEMPTS
charged attempts (more on a cluster armed for recovery) it is LOST. A restarted agent first ends what its predecessor
on this host left running, so one run never has two attempts at once.

An attempt is charged unless Google, not tpuctl, brought its host back: the same host in a new boot (hostboot.py) is
a TPU VM that Google restarted beneath the run. Google repairs a slice "by restarting [it] on healthy hardware" and
recovers "host maintenance events" the same way (cloud.google.com/tpu/docs/failure-recovery, "Failure recovery in
managed capacity mode"), and on a Multislice a repaired slice restarts every other slice too (Multislice docs,
"Autorepair"; issue 39): each is a new attempt on every host, and a long run sees many. An agent restarted on a live
host (same boot: a crash, an OOM kill, a job that takes its agent down) and a host `up` or the recovery watcher made
anew (another name) are charged, so a run that keeps breaking its host still ends."""
from __future__ import annotations

import json
import sys
import time
from typing import Callable

from ..core import layout, runindex, runs
from ..core.runs import RunSpec, RunState, RunStatus
from . import kerasbackend, podruntime
from .contexts import Seat
from .hostboot import boot_id
from .jobprocs import JobProcesses, started_for

MAX_ATTEMPTS = 3


class Claims:
    def __init__(self, seat: Seat, write_status: Callable[[str, RunStatus], None]) -> None:
        """`write_status`: a run's status for this worker, as the agent writes it (a LOST run's)."""
        self.seat, self.write_status = seat, write_status
        self.done: set[str] = set()          # runs this agent ran, or will never run
        self.specs: dict[str, RunSpec] = {}  # job.json is written once: read it once per run
        self.ended_here: set[str] = set()    # runs whose attempt on this host a predecessor left running, now ended
        self.indexed = False                 # runindex.ensure done: once per agent, not once a tick
        self.followed: dict[str, str] = {}   # run -> the TPU runtime request (podruntime.py) this worker served
        self.interrupted: dict[str, bool] = {}   # runs taken over from an attempt its host's stop interrupted

    def runs_here(self, job: RunSpec) -> bool:
        """TensorFlow on a slice runs ONE program, on worker 0; JAX and PyTorch run on every worker (GCP_FACTS §6;
        ml-auto-solutions runs TF pod tests with all_workers=not is_pod). A Keras job: as its backend."""
        seat = self.seat
        return kerasbackend.framework(job, seat.record, seat.accelerator) != "tensorflow" or seat.worker == 0

    def follows_done(self, run_id: str, job: RunSpec) -> bool:
        """A run that runs on worker 0 alone: True once this worker has nothing more to do for it. On a
        multi-host base-runtime slice a TensorFlow run asks every worker to serve its TensorFlow first
        (podruntime.py): followed here for each attempt, until the run is final."""
        a = self.seat
        if not podruntime.applies(a.record, kerasbackend.framework(job, a.record, a.accelerator)):
            return True
        request = podruntime.read(a.store, layout.run_tpu_runtime(run_id))
        if request and self.followed.get(run_id) != request.get("for"):
            print(f"tpuctl agent: {podruntime.follow(a.store, a.worker, a.host, request)}", file=sys.stderr,
                  flush=True)
            self.followed[run_id] = str(request.get("for"))
        return runs.status(a.store, run_id, 0).state.final

    def end_orphans(self) -> None:
        """Ends the attempts a predecessor on this host left running (a job outlives an agent killed with
        SIGKILL); their runs are then resumed at once, without waiting for them to go stale. That includes an
        attempt left `starting` (no job pid yet: killed while it prepared the run, or between the job's start and
        its first `running` status, right at run.started): this agent started on this host, so the one that wrote
        it is gone; before, such a run waited TPUCTL_STALE_SECONDS in `starting` (issue 38.11)."""
        a = self.seat
        for run_id in self.queue():
            st = runs.status(a.store, run_id, a.worker)
            if st.state.final or st.host != a.host:
                continue
            for left in [JobProcesses(st.pid, run_id=run_id)] if st.pid else started_for(run_id, a.worker):
                if left.processes():
                    print(f"tpuctl agent: ending run {run_id}'s attempt {st.attempt} left by the previous agent",
                          file=sys.stderr, flush=True)
                    left.end(grace=5.0)
            self.ended_here.add(run_id)

    def next(self) -> tuple[str, int] | None:
        """Claims the first run this host may take now, oldest first: (run id, attempt), or None."""
        a = self.seat
        for run_id in self.queue():
            if run_id in self.done:
                continue
            if run_id not in self.specs:
                spec = runs.job(a.store, run_id)
                if spec is None:   # job.json is written before the queue entry: this one names no run
                    runindex.forget(a.store, run_id)
                    self.done.add(run_id)
                    continue
                self.specs[run_id] = spec
            if not self.runs_here(self.specs[run_id]):
                if self.follows_done(run_id, self.specs[run_id]):
                    self.done.add(run_id)   # never claimed here, so never taken over here either
                continue
            first = a.store.read(layout.run_claim(run_id, a.worker))
            if first is None:
                if a.store.create(layout.run_claim(run_id, a.worker), self._record(1)):
                    self.done.add(run_id)
                    return run_id, 1
                continue   # another agent won the race; look at it again later, it may die
            st = runs.status(a.store, run_id, a.worker)
            if st.state.final:
                runindex.settle(a.store, run_id, a.workers)   # its final status was written, the settle lost
                self.done.add(run_id)
                continue
            last = st.heartbeat or float(json.loads(first).get("time", 0))
            # an attempt whose agent was stopped said so (attempt.py): resumed at once, not after the stale wait
            interrupted = st.state is RunState.INTERRUPTED
            stale = interrupted or time.time() - last >= runs.stale_seconds()
            if not stale and run_id not in self.ended_here:
                continue
            attempt = st.attempt + 1
            charged = self.charged(run_id, st.attempt)
            if charged > self.max_attempts():
                st.state, st.ended = RunState.LOST, time.time()
                self.write_status(run_id, st)
                self.done.add(run_id)
                continue
            if a.store.create(layout.run_claim(run_id, a.worker, attempt), self._record(attempt, charged)):
                self.done.add(run_id)
                self.interrupted[run_id] = interrupted
                return run_id, attempt
        return None

    def queue(self) -> list[str]:
        ids = runindex.queued(self.seat.store, ensured=self.indexed)
        self.indexed = True
        return ids

    def max_attempts(self) -> int:
        """MAX_ATTEMPTS, plus one per re-create a recovery watcher may make (`up --recover --max-recoveries`): a
        run on spot capacity may be preempted more often than a run whose host fails."""
        try:
            doc = json.loads(self.seat.store.read(layout.WATCH_ARMED) or b"{}")
            return MAX_ATTEMPTS + (int(doc.get("max_recoveries", 0)) if doc.get("armed") else 0)
        except (ValueError, TypeError, AttributeError):
            return MAX_ATTEMPTS

    def charged(self, run_id: str, last: int) -> int:
        """The charged attempts once this host takes attempt last+1 of the run: the last attempt's claim's count,
        plus one unless this is the host that ran it, restarted beneath it (another boot: Google's doing). A
        claim written before this rule, or unreadable, counts every attempt."""
        a = self.seat
        try:
            prev = json.loads(a.store.read(layout.run_claim(run_id, a.worker, last)) or b"{}")
            before = int(prev.get("charged", last))
        except (ValueError, TypeError, AttributeError):
            prev, before = {}, last
        mine = boot_id()
        google = bool(mine) and prev.get("host") == a.host and bool(prev.get("boot")) and prev.get("boot") != mine
        return before + (0 if google else 1)

    def _record(self, attempt: int, charged: int = 1) -> bytes:
        return json.dumps({"host": self.seat.host, "worker": self.seat.worker, "time": time.time(),
                           "attempt": attempt, "charged": charged, "boot": boot_id()}).encode()
