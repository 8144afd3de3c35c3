"""The agent: runs ON the host (TPU VM worker, the legacy node's VM, or this machine for --provider local).

It needs only the store. Its main loop, here: read the cluster record, claim the next run (claims.py), run one
attempt of it (attempt.py: package, requirements, the command, its logs and heartbeats, cancel), heartbeat
(agent-<host>.json: who it is, what it runs, when autostop would fire), and on worker 0 end the compute when the
cluster's policy says so (autostop.py).

    python -m tpuctl.agent --store URI [--slice K] [--worker N] [--accelerator v3-8|cpu] [--tpu local|grpc://IP:8470]

On a Multislice cluster (core/multislice.py) the host is worker N of slice K; its runs' store keys (claims,
statuses, logs) use its index across all slices, K x hosts-per-slice + N, so slice 0's keys are a single slice's.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from ..core import knobs, layout, notify, runindex, runs
from ..core.errors import TpuctlError
from ..core.lifecycle import Clock, Policy
from ..core.packaging import MAX_BYTES, MAX_ENTRIES
from ..core.runs import RunSpec, RunState, RunStatus
from ..providers.stores import open_store
from .attempt import Attempt
from .autostop import SelfStop
from .chipsampler import ChipSampler
from .claims import Claims
from .heldoutput import HeldOutput
from .storeguard import StoreGuard
from .supervisor import HEARTBEAT_SECONDS

SERVING = "serving the TPU runtime (the TensorFlow program runs on worker 0)"


class Agent:
    def __init__(self, store_uri: str, worker: int = 0, accelerator: str = "", tpu: str | None = None,
                 home: str | None = None, poll: float = 1.0, slice_id: int = 0) -> None:
        self.store = open_store(store_uri)
        self.worker = worker                 # index across slices, once the record says the slice's size
        self.slice, self.slice_worker = slice_id, worker
        self.accelerator = accelerator or os.environ.get("TPUCTL_ACCELERATOR", "cpu")
        self.tpu = tpu if tpu is not None else os.environ.get("TPUCTL_TPU", "")
        self.home = Path(home or os.environ.get("TPUCTL_AGENT_HOME") or Path.home() / ".tpuctl-agent")
        self.poll = poll
        self.host = os.environ.get("TPUCTL_HOST") or socket.gethostname()
        self.stop = threading.Event()
        self.last_beat = 0.0
        self.record: dict[str, Any] = {}
        self.clock = Clock()                 # idleness, for autostop (core/lifecycle.py)
        self.claims = Claims(self, self.write_status)
        self.selfstop = SelfStop(self, self.stop, self.clock)
        self.guard = StoreGuard(self.store)
        self.external_restarts = False   # `--run`: the JobSet restarts the run, not this agent (run_one)
        self.held = HeldOutput(self.stop, self.beat)   # ended runs' output the full store could not take yet

    def read_record(self) -> dict[str, Any]:
        """The cluster record; `up` rewrites it (the legacy node's address appears once the node is READY)."""
        self.record = runs.read_json(self.store, layout.CLUSTER_RECORD) or self.record
        self.worker = self.slice * int(self.record.get("hosts") or 1) + self.slice_worker
        return self.record

    def package_limits(self) -> tuple[int, int]:
        """(bytes, entries) a job package may unpack to: the agent's environment, else the cluster record."""
        def limit(env: str, key: str, default: int) -> int:
            return knobs.count(env, int(self.record.get(key) or default))
        return (limit("TPUCTL_MAX_PACKAGE_BYTES", "max_package_bytes", MAX_BYTES),
                limit("TPUCTL_MAX_PACKAGE_ENTRIES", "max_package_entries", MAX_ENTRIES))

    @property
    def workers(self) -> int:
        """Hosts that run a JAX or PyTorch run: every host of every slice."""
        return int(self.record.get("hosts") or 1) * int(self.record.get("slices") or 1)

    def serves_only(self) -> bool:
        """A TensorFlow slice's worker N > 0: it serves the TPU runtime; the program runs on worker 0 alone."""
        return self.worker > 0 and self.record.get("framework", "tensorflow") == "tensorflow"

    def beat(self, running: str = "") -> None:
        """The agent's heartbeat; one the store refuses is reported (storeguard.py) and the next one tries again."""
        role = SERVING if self.serves_only() else "agent"
        policy = Policy.of(self.record) if self.worker == 0 else Policy()
        self.last_beat = time.monotonic()
        try:
            self.store.write(layout.agent_heartbeat(self.host, self.worker), json.dumps(
                {"host": self.host, "worker": self.worker, "pid": os.getpid(), "version": __version__,
                 "time": time.time(), "running": running, "role": role, "problem": self.guard.problem,
                 "held_bytes": self.held.waiting_bytes(),
                 "autostop_at": 0.0 if running else self.clock.autostop_at(policy),
                 "deadline": policy.deadline}).encode())
            self.guard.wrote()
        except Exception as e:  # noqa: BLE001 - a store that refuses a heartbeat must not end the agent
            self.guard.failed(e, "the heartbeat")

    def beat_if_quiet(self, running: str = "") -> None:
        """The heartbeat, when none went out for HEARTBEAT_SECONDS x 6 (a long tick, a job supervised long)."""
        if time.monotonic() - self.last_beat > HEARTBEAT_SECONDS * 6:
            self.beat(running)

    def write_status(self, run_id: str, st: RunStatus) -> None:
        """A run's status. One the store refuses is reported and left to the next heartbeat, except a final one,
        tried until it is written (or the agent is stopped): a run must not stay `running` once it ended."""
        st.host, st.worker = self.host, self.worker
        st.note = st.note or self.guard.problem
        delay = 0.5
        while True:
            st.heartbeat = time.time()
            try:
                self.store.write(layout.run_status(run_id, self.worker), json.dumps(st.to_json()).encode())
                break
            except Exception as e:  # noqa: BLE001 - reported; the run is settled once the store takes it
                if self.guard.failed(e, f"run {run_id}'s status"):
                    continue   # the reserve gave it room: again at once
                if not st.state.final or self.stop.is_set():
                    return
                self.stop.wait(delay)
                delay = min(delay * 2, 30.0)
        self.guard.wrote()
        if st.state.final:
            try:
                runindex.settle(self.store, run_id, self.workers)
            except Exception as e:  # noqa: BLE001 - the next agent or command settles it (runindex.py)
                self.guard.failed(e, f"run {run_id}'s queue entry")

    def idle_limit(self) -> str:
        """Why autostop ends a run that stalled and was only notified ("" while it does not): autostop.py."""
        return self.selfstop.idle_limit()

    def tpu_address(self) -> str:
        if self.tpu:
            return self.tpu
        return str(self.record.get("tpu_address", "")) if self.record.get("arch") == "node" else ""

    def wait_tpu_address(self, heartbeat: Callable[[], None]) -> str:
        """Beside a legacy node the address is known only once the node is READY, after this VM booted: `up`
        writes it into the record then. Re-read until it appears (TPUCTL_TPU_ADDRESS_WAIT, 30 minutes)."""
        deadline = time.monotonic() + knobs.number("TPUCTL_TPU_ADDRESS_WAIT", 1800)
        while not self.tpu_address() and self.record.get("arch") == "node" and time.monotonic() < deadline \
                and not self.stop.is_set():
            heartbeat()
            self.stop.wait(min(self.poll * 5, 5.0))
            self.read_record()
        return self.tpu_address()

    def start(self) -> None:
        """The record, what a predecessor left running, the first heartbeat. A store that cannot be read yet (a
        bucket whose grants have not applied, an outage) is waited for with backoff, each try logged, as the
        start-up script waits for the wheel: an agent that exits here has nobody to restart it on this machine."""
        delay, tries = self.poll, 0
        while not self.stop.is_set():
            tries += 1
            try:
                self.read_record()
                self.claims.end_orphans()
                break
            except Exception as e:  # noqa: BLE001 - whatever the store raises, wait and try again
                print(f"tpuctl agent: store {self.store.uri} not readable yet ({type(e).__name__}: {e}); try "
                      f"{tries}, next in {delay:g}s", file=sys.stderr, flush=True)
                self.stop.wait(delay)
                delay = min(delay * 2, knobs.number("TPUCTL_STORE_WAIT_MAX", 30))
        self.guard.keep_reserve()
        self.beat()

    def run_forever(self) -> None:
        self.start()
        while not self.stop.is_set():
            try:
                self.read_record()
                self.selfstop.check_teardown()
                if not self.selfstop.ending:
                    self.tick()
                self.selfstop.enforce()
            except Exception as e:  # noqa: BLE001 - a store hiccup must not kill the agent; log and go on
                print(f"tpuctl agent: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                self.guard.failed(e, "claiming the next run")   # a full store: the reserve makes room for the claim
            self.beat_if_quiet()
            self.stop.wait(self.poll)
        self.held.join(5.0)

    def tick(self) -> bool:
        """Claim and execute at most one run (new, or taken over from a host that went quiet). True when one ran."""
        claimed = self.claims.next()
        if claimed is None:
            return False
        run_id, attempt = claimed
        try:
            self.execute(run_id, attempt)
        except Exception:
            self.claims.done.discard(run_id)   # not settled: taken over (attempt + 1) once its heartbeat is stale
            raise
        self.after_run(self.claims.specs[run_id])
        return True

    def execute(self, run_id: str, attempt: int = 1) -> int:
        # the spec claims read, and whether the attempt before was its host's stop (claims.py), go to the attempt
        with ChipSampler(self.store, run_id, self.worker).running():   # the chips' duty cycle while it runs
            return Attempt(self, run_id, attempt, self.claims.specs.get(run_id),
                           self.claims.interrupted.pop(run_id, False), self.selfstop.run_limit).run()

    def run_one(self, run_id: str, attempt: int) -> int:
        """`--run ID`: a pod of the run's JobSet (providers/gke/manifest.py) runs this one run and exits with its
        job's code, which the Job's pod failure policy reads; restarts are the JobSet's (`attempt` = its restart
        attempt + 1), so the agent never restarts the job itself. A worker that only follows a run (TensorFlow's
        workers N > 0) waits for its end and exits 0."""
        self.external_restarts = True
        self.start()
        job = runs.job(self.store, run_id)
        if job is None:
            print(f"tpuctl agent: run {run_id} has no job.json in {self.store.uri}", file=sys.stderr, flush=True)
            return 127
        self.claims.specs[run_id] = job
        prev = runs.status(self.store, run_id, self.worker)
        if prev.state is RunState.INTERRUPTED and prev.attempt >= attempt:
            # the same JobSet attempt started again: Kueue resumed the JobSet it had suspended to evict it
            # (providers/gke/kueue.py), which JobSet does not count as a restart; the run goes on as a new attempt
            attempt = prev.attempt + 1
        if not self.claims.runs_here(job):
            while not self.stop.is_set() and not runs.status(self.store, run_id, 0).state.final:
                self.beat(run_id)
                self.stop.wait(self.poll)
            return 0
        return self.execute(run_id, attempt)

    def after_run(self, job: RunSpec) -> None:
        self.clock.busy()
        self.beat()   # with the new autostop time, for `status`
        if job.down_after and self.worker == 0 and not self.stop.is_set() and not self.selfstop.ending:
            self.selfstop.end_compute(f"run {job.id} ended (submit --down)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="tpuctl agent", description="Run jobs from a tpuctl store.")
    ap.add_argument("--store", required=True, help="gs://bucket or a directory")
    try:
        worker = knobs.count("TPUCTL_WORKER", 0)
    except TpuctlError as e:
        ap.error(f"{e.message}; {e.hint}")   # exits 2, one line
    ap.add_argument("--worker", type=int, default=worker)
    ap.add_argument("--slice", type=int, default=0, help="the host's slice of a Multislice cluster")
    ap.add_argument("--accelerator", default=None)
    ap.add_argument("--tpu", default=None)
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--run", default=None, help="run this one run and exit with its code (a GKE pod)")
    ap.add_argument("--attempt", type=int, default=1, help="with --run: the JobSet's restart attempt + 1")
    a = ap.parse_args(argv)
    os.umask(0o077)   # unpacked jobs and their files may hold [env] secrets
    for bad in knobs.problems():   # said once here; each run the agent takes ends on it with the reason (attempt.py)
        print(f"tpuctl agent: {bad.message}; {bad.hint}", file=sys.stderr, flush=True)
    agent = Agent(a.store, a.worker, a.accelerator or "", a.tpu, poll=a.poll, slice_id=a.slice)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    if a.run:
        code = agent.run_one(a.run, a.attempt)
        notify.flush()
        sys.exit(code)
    agent.run_forever()
    notify.flush()   # what it has to tell (the stop it made) leaves before it exits, within the retry bound
