"""The agent: runs ON the host (TPU VM worker, the legacy node's VM, or this machine for --provider local).

It needs only the store: it claims each new run once (create-if-absent), unpacks the run's package, installs its
requirements into an environment of their own that sees the image's TensorFlow (jobenv.py), runs the command with
the TPUCTL_* environment, ships stdout+stderr (merged by the OS, so in order) as numbered chunks about every half
second or 64 KiB, heartbeats into status.json, and honours cancel (SIGTERM to the job's processes, SIGKILL after a
grace period). Log shipping is logshipper.py, the job's processes jobprocs.py, what a framework needs on a TPU VM
tpuenv.py.

    python -m tpuctl.agent --store URI [--worker N] [--accelerator v3-8|cpu] [--tpu local|grpc://IP:8470]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .. import __version__
from . import google_api as hostapi, jobenv
from ..core import layout, runs
from .jobprocs import JobProcesses
from ..core.lifecycle import Clock, Policy
from .logshipper import LogShipper
from ..core.packaging import MAX_BYTES, MAX_ENTRIES, unpack
from .preamble import PreambleFilter
from ..providers import open_store
from ..core.runs import RunSpec, RunState, RunStatus
from ..runtime import prefer_legacy_keras
from .tpuenv import tpu_environment

HEARTBEAT_SECONDS = 5.0
MAX_ATTEMPTS = 3
SERVING = "serving the TPU runtime (the TensorFlow program runs on worker 0)"
_PINNED = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-keras", "keras", "libtpu", "libtpu-nightly",
           "tensorboard", "tf-nightly")


def _constraints(path: Path) -> Path:
    """Pins of the image's TensorFlow stack, so a job's requirements can add packages but never swap TF."""
    from importlib import metadata
    pins = sorted({f"{d.metadata['Name'].lower()}=={d.version}" for d in metadata.distributions()
                   if (d.metadata["Name"] or "").lower() in _PINNED})
    path.write_text("\n".join(pins) + "\n")
    return path


class Agent:
    def __init__(self, store_uri: str, worker: int = 0, accelerator: str = "", tpu: str | None = None,
                 home: str | None = None, poll: float = 1.0) -> None:
        self.store = open_store(store_uri)
        self.worker = worker
        self.accelerator = accelerator or os.environ.get("TPUCTL_ACCELERATOR", "cpu")
        self.tpu = tpu if tpu is not None else os.environ.get("TPUCTL_TPU", "")
        self.home = Path(home or os.environ.get("TPUCTL_AGENT_HOME") or Path.home() / ".tpuctl-agent")
        self.poll = poll
        self.host = os.environ.get("TPUCTL_HOST") or socket.gethostname()
        self.done: set[str] = set()
        self.stop = threading.Event()
        self._last_beat = 0.0
        self.record: dict[str, Any] = {}
        self.ended_here: set[str] = set()   # runs whose attempt on this host a predecessor left running, now ended
        self.specs: dict[str, RunSpec] = {}  # job.json is written once: read it once per run
        self.clock = Clock()                 # idleness, for autostop (lifecycle.py)
        self.ending = False                  # this host asked for its own deletion
        self._retry_at = 0.0                 # when a refused self-deletion may be tried again
        self._checked_for: object = None     # the `up` (record's `written`) the teardown check answered

    def read_record(self) -> dict[str, Any]:
        """The cluster record; `up` rewrites it (the legacy node's address appears once the node is READY)."""
        self.record = runs.read_json(self.store, layout.CLUSTER_RECORD) or self.record
        return self.record

    def package_limits(self) -> tuple[int, int]:
        """(bytes, entries) a job package may unpack to: the agent's environment, else the cluster record."""
        def limit(env: str, key: str, default: int) -> int:
            return int(os.environ.get(env) or self.record.get(key) or default)
        return (limit("TPUCTL_MAX_PACKAGE_BYTES", "max_package_bytes", MAX_BYTES),
                limit("TPUCTL_MAX_PACKAGE_ENTRIES", "max_package_entries", MAX_ENTRIES))

    @property
    def workers(self) -> int:
        return int(self.record.get("hosts") or 1)

    def serves_only(self) -> bool:
        """A TensorFlow slice's worker N > 0: it serves the TPU runtime; the program runs on worker 0 alone."""
        return self.worker > 0 and self.record.get("framework", "tensorflow") == "tensorflow"

    def runs_here(self, job: RunSpec | None) -> bool:
        """TensorFlow on a slice runs ONE program, on worker 0; JAX and PyTorch run on every worker (GCP_FACTS §6;
        ml-auto-solutions runs TF pod tests with all_workers=not is_pod)."""
        return job is not None and (job.framework != "tensorflow" or self.worker == 0)

    def beat(self, running: str = "") -> None:
        role = SERVING if self.serves_only() else "agent"
        policy = Policy.of(self.record) if self.worker == 0 else Policy()
        self.store.write(layout.agent_heartbeat(self.host, self.worker), json.dumps(
            {"host": self.host, "worker": self.worker, "pid": os.getpid(), "version": __version__,
             "time": time.time(), "running": running, "role": role,
             "autostop_at": 0.0 if running else self.clock.autostop_at(policy), "deadline": policy.deadline}).encode())
        self._last_beat = time.monotonic()

    def end_compute(self, reason: str) -> None:
        """Worker 0 ends the cluster's compute itself: the record of why first (status reads it; the deletion may
        end this host before another write), then the teardown the cluster record names: "exit" (the local agent
        stops), or "gcp" (the host deletes its TPU, queued resource or VM as its own identity, hostapi.py). A
        deletion Google refuses turns the record into a failure and is tried again TEARDOWN_RETRY later."""
        if time.monotonic() < self._retry_at:
            return
        how = self.record.get("teardown")
        stopped = {"reason": reason, "time": time.time(), "host": self.host, "worker": self.worker}
        self.store.write(layout.STOPPED, json.dumps(stopped).encode())
        print(f"tpuctl agent: ending the compute: {reason}", file=sys.stderr, flush=True)
        if how == "exit":
            self.stop.set()
        elif how == "gcp":
            try:
                for target in hostapi.targets(self.record):
                    hostapi.delete(target)
            except Exception as e:  # noqa: BLE001 - a refused or unreachable API: say so where status looks
                failed = f"{type(e).__name__}: {e}"
                self.store.write(layout.STOPPED, json.dumps({**stopped, "failed": failed}).encode())
                print(f"tpuctl agent: could not end the compute: {failed}", file=sys.stderr, flush=True)
                self._retry_at = time.monotonic() + float(os.environ.get("TPUCTL_TEARDOWN_RETRY", "60"))
                return
            self.ending = True   # the deletion is under way: take no new run while the host still lives

    def check_teardown(self) -> None:
        """Worker 0 of a Google Cloud host reports, for each `up` (the record's `written`), whether its own
        identity holds what deleting the compute needs: `up --autostop` waits for this report, and `status`
        shows autostop as enforced only on its word. testIamPermissions sees project-level grants, the only ones
        that can carry tpu.nodes.delete (lifecycle.py)."""
        written = self.record.get("written")
        if self.worker != 0 or self.record.get("teardown") != "gcp" or written == self._checked_for:
            return
        self._checked_for = written
        needed = sorted({t.permission for t in hostapi.targets(self.record)})
        report: dict[str, Any] = {"for": written, "host": self.host, "time": time.time(), "needed": needed}
        try:
            report["identity"] = hostapi.identity()
            have = hostapi.held(str(self.record.get("project", "")), needed)
            report["missing"] = [p for p in needed if p not in have]
        except Exception as e:  # noqa: BLE001 - cannot tell: never report able
            report["missing"], report["error"] = needed, f"{type(e).__name__}: {e}"
        report["able"] = not report["missing"]
        self.store.write(layout.TEARDOWN_CHECK, json.dumps(report).encode())

    def enforce(self, running: bool = False) -> None:
        if self.worker != 0 or self.ending:
            return
        reason = self.clock.due(Policy.of(self.record), running)
        if reason:
            self.end_compute(reason)

    def tpu_address(self) -> str:
        if self.tpu:
            return self.tpu
        return str(self.record.get("tpu_address", "")) if self.record.get("arch") == "node" else ""

    def wait_tpu_address(self, heartbeat: Callable[[], None]) -> str:
        """Beside a legacy node the address is known only once the node is READY, after this VM booted: `up`
        writes it into the record then. Re-read until it appears (TPUCTL_TPU_ADDRESS_WAIT, 30 minutes)."""
        deadline = time.monotonic() + float(os.environ.get("TPUCTL_TPU_ADDRESS_WAIT", "1800"))
        while not self.tpu_address() and self.record.get("arch") == "node" and time.monotonic() < deadline \
                and not self.stop.is_set():
            heartbeat()
            self.stop.wait(min(self.poll * 5, 5.0))
            self.read_record()
        return self.tpu_address()

    def end_orphans(self) -> None:
        """A restarted agent first ends what its predecessor on this host left running (a job outlives an agent
        killed with SIGKILL), so one run never has two attempts at once; it then resumes those runs at once."""
        for run_id in runs.all_ids(self.store):
            st = runs.status(self.store, run_id, self.worker)
            if st.state.final or st.host != self.host or not st.pid:
                continue
            left = JobProcesses(st.pid, run_id=run_id)
            if left.processes():
                print(f"tpuctl agent: ending run {run_id}'s attempt {st.attempt} left by the previous agent",
                      file=sys.stderr, flush=True)
                left.end(grace=5.0)
            self.ended_here.add(run_id)

    def run_forever(self) -> None:
        self.read_record()
        self.end_orphans()
        self.beat()
        while not self.stop.is_set():
            try:
                self.read_record()
                self.check_teardown()
                if not self.ending:
                    self.tick()
                self.enforce()
            except Exception as e:  # noqa: BLE001 - a store hiccup must not kill the agent; log and go on
                print(f"tpuctl agent: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            if time.monotonic() - self._last_beat > HEARTBEAT_SECONDS * 6:
                self.beat()
            self.stop.wait(self.poll)

    def tick(self) -> bool:
        """Claim and execute at most one new run, or take over one whose host stopped heartbeating (a preempted
        or deleted TPU VM: `tpuctl up` recreates it and this agent resumes the run, same run id and output dir,
        so a job that checkpoints continues). True when one ran."""
        for run_id in runs.all_ids(self.store):
            if run_id in self.done:
                continue
            if run_id not in self.specs:
                spec = runs.job(self.store, run_id)
                if spec is None:
                    continue   # listed before its job.json is readable: look again next tick
                self.specs[run_id] = spec
            if not self.runs_here(self.specs[run_id]):
                self.done.add(run_id)   # never claimed here, so never taken over here either
                continue
            first = self.store.read(layout.run_claim(run_id, self.worker))
            if first is None:
                if self.store.create(layout.run_claim(run_id, self.worker), self._claim_record(1)):
                    self.done.add(run_id)
                    self.execute(run_id)
                    self.after_run(self.specs[run_id])
                    return True
                continue   # another agent won the race; look at it again later, it may die
            st = runs.status(self.store, run_id, self.worker)
            if st.state.final:
                self.done.add(run_id)
                continue
            last = st.heartbeat or float(json.loads(first).get("time", 0))
            stale = time.time() - last >= runs.stale_seconds()
            if not stale and run_id not in self.ended_here:
                continue
            attempt = st.attempt + 1
            if attempt > MAX_ATTEMPTS:
                st.state, st.ended = RunState.LOST, time.time()
                self._write_status(run_id, st)
                self.done.add(run_id)
                continue
            if self.store.create(layout.run_claim(run_id, self.worker, attempt), self._claim_record(attempt)):
                self.done.add(run_id)
                self.execute(run_id, attempt)
                self.after_run(self.specs[run_id])
                return True
        return False

    def after_run(self, job: RunSpec) -> None:
        self.clock.busy()
        self.beat()   # with the new autostop time, for `status`
        if job.down_after and self.worker == 0 and not self.stop.is_set() and not self.ending:
            self.end_compute(f"run {job.id} ended (submit --down)")

    def _claim_record(self, attempt: int) -> bytes:
        return json.dumps({"host": self.host, "worker": self.worker, "time": time.time(),
                           "attempt": attempt}).encode()

    def _write_status(self, run_id: str, st: RunStatus) -> None:
        st.host, st.worker, st.heartbeat = self.host, self.worker, time.time()
        self.store.write(layout.run_status(run_id, self.worker), json.dumps(st.to_json()).encode())

    def environment(self, run_id: str, job: RunSpec) -> dict[str, str]:
        env = dict(os.environ)
        env.update(job.env)
        out = self.store.local_path(layout.run_output(run_id))
        data = self.store.local_path(layout.run_data(run_id).rstrip("/"))
        if not out.startswith("gs://"):
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(data).mkdir(parents=True, exist_ok=True)   # there even when the run has no data
        framework_env = tpu_environment(job.framework, self.record, self.accelerator)
        env.update(TPUCTL_RUN_ID=run_id, TPUCTL_STORE=self.store.uri, TPUCTL_DATA_DIR=data, TPUCTL_OUTPUT_DIR=out,
                   TPUCTL_ACCELERATOR=self.accelerator, TPUCTL_TPU=framework_env.get("TPU_NAME", self.tpu_address()),
                   TPUCTL_WORKER=str(self.worker), TPUCTL_NUM_WORKERS=str(self.workers), PYTHONUNBUFFERED="1")
        for k, v in framework_env.items():
            if k not in job.env:   # a job's own value wins
                env[k] = v
        prefer_legacy_keras(env)
        # `python` in a job's command means the agent's own interpreter (its venv has the agent's packages).
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        return env

    def execute(self, run_id: str, attempt: int = 1) -> int:
        job = self.specs.get(run_id) or runs.job(self.store, run_id)
        started = time.time()

        def status(state: RunState, exit_code: int | None = None, pid: int | None = None) -> None:
            self._write_status(run_id, RunStatus(state=state, exit_code=exit_code, pid=pid, started=started,
                                                 attempt=attempt, ended=time.time() if state.final else None))
        if self.store.read(layout.run_cancel(run_id)) is not None:
            status(RunState.CANCELLED)   # cancelled while queued: it never starts
            return 130
        status(RunState.STARTING)
        work = self.home / "runs" / run_id / f"w{self.worker}"
        code_dir = work / "code"
        quiet = None if job is not None and job.env.get("TPUCTL_TF_PREAMBLE") == "1" else \
            PreambleFilter(gpu=self.accelerator.startswith("gpu"))
        shipper = LogShipper(self.store, run_id, self.worker, quiet)
        if attempt > 1:
            shipper.note(f"the previous host stopped heartbeating; run resumed on {self.host} (attempt {attempt})",
                        fresh_line=True)
        try:
            if job is None:
                raise RuntimeError(f"{layout.run_job(run_id)} is unreadable")
            pkg = self.store.read(layout.job_package(job.package))
            if pkg is None:
                raise RuntimeError(f"package {job.package} is missing from the store")
            if hashlib.sha256(pkg).hexdigest() != job.package:
                raise RuntimeError(f"package {job.package} does not match its sha256 name")
            unpack(pkg, code_dir, *self.package_limits())
            if self.record.get("arch") == "node" and not self.tpu_address():
                shipper.note("waiting for the TPU node's address (tpuctl up writes it once the node is READY)")
                if not self.wait_tpu_address(lambda: status(RunState.STARTING)):
                    raise RuntimeError("the TPU node's address never appeared in the cluster record")
        except Exception as e:  # noqa: BLE001 - reported in the run's own log and status
            shipper.note(f"cannot prepare the run: {e}")
            status(RunState.FAILED, exit_code=127)
            return 127
        script = "set -e\n"
        if job.requirements:
            cons = _constraints(work / "constraints.txt")
            req = code_dir / job.requirements
            # a missing file hashes as empty; pip then says in the run's log that it is missing
            env_dir = jobenv.env_dir(self.home, req.read_bytes() if req.is_file() else b"", cons.read_bytes())
            script += jobenv.script(env_dir, job.requirements, cons)
        # As written, through bash: `prepare && train`, `cd sub && ...`, `VAR=1 python ...` all work; arguments
        # after `--` are appended shell-quoted (to the last command of a list).
        script += "set +e\n" + job.command + "".join(" " + shlex.quote(a) for a in job.args) + "\n"
        proc = subprocess.Popen(["bash", "-c", script], cwd=code_dir, env=self.environment(run_id, job),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        stdout = proc.stdout
        assert stdout is not None, "Popen(stdout=PIPE) always sets it"
        procs = JobProcesses(proc.pid, pipe_inode=os.fstat(stdout.fileno()).st_ino)
        stop_pump = threading.Event()
        pump = threading.Thread(target=shipper.pump, args=(stdout.fileno(), stop_pump), daemon=True)
        pump.start()
        status(RunState.RUNNING, pid=proc.pid)
        cancelled = False
        kill_at: float | None = None
        drain = float(os.environ.get("TPUCTL_DRAIN_SECONDS", "10"))
        main_ended: float | None = None
        left: list[int] = []
        last_beat = last_cancel_check = time.monotonic()
        # The run ends when the job's main process ends. Whatever it left running (`tensorboard &`, `nohup ...`, a
        # daemon that called setsid) may still hold its output: it gets `drain` seconds to finish writing, then it
        # is ended too, so one job can never keep the agent, its heartbeats and the next runs waiting.
        while pump.is_alive() or proc.poll() is None:
            pump.join(0.1)
            now = time.monotonic()
            if not cancelled and self.stop.is_set():
                # The agent itself is being stopped (`tpuctl down`): take the job down with it, never orphan it.
                cancelled = True
                procs.signal(signal.SIGTERM)
                kill_at = now + 5.0
            if not cancelled and now - last_cancel_check >= 1.0:
                last_cancel_check = now
                self.clock.busy()
                # the hard deadline ends the run like a cancel, then the compute (enforce, next tick)
                deadline = self.worker == 0 and bool(self.clock.due(Policy.of(self.record), running=True))
                if deadline:
                    shipper.note("the cluster's --max-duration deadline has come: ending the run", fresh_line=True)
                if deadline or self.store.read(layout.run_cancel(run_id)) is not None:
                    cancelled = True
                    procs.signal(signal.SIGTERM)
                    kill_at = now + float(os.environ.get("TPUCTL_CANCEL_GRACE", "30"))
            if main_ended is None and proc.poll() is not None:
                main_ended = now
            if main_ended is not None and not left and now - main_ended >= drain:
                left = procs.processes() or [-1]
                procs.signal(signal.SIGTERM)
                kill_at = min(kill_at or now + 2.0, now + 2.0)
            if kill_at and now >= kill_at:
                procs.signal(signal.SIGKILL)
                kill_at = None
                if main_ended is not None:
                    stop_pump.set()   # nothing of the job is left to write; stop reading whatever holds the pipe
            if now - last_beat >= HEARTBEAT_SECONDS:
                last_beat = now
                status(RunState.RUNNING, pid=proc.pid)
                if now - self._last_beat > HEARTBEAT_SECONDS * 6:
                    self.beat(run_id)
        stdout.close()
        if left and left != [-1]:
            shipper.note(f"the job's main process ended; {len(left)} process(es) it left running still held its "
                         f"output after {drain:g}s and were ended (pids {', '.join(map(str, left))})", fresh_line=True)
        rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        status(RunState.CANCELLED if cancelled else (RunState.SUCCEEDED if rc == 0 else RunState.FAILED), exit_code=rc)
        return rc


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="tpuctl agent", description="Run jobs from a tpuctl store.")
    ap.add_argument("--store", required=True, help="gs://bucket or a directory")
    ap.add_argument("--worker", type=int, default=int(os.environ.get("TPUCTL_WORKER", "0")))
    ap.add_argument("--accelerator", default=None)
    ap.add_argument("--tpu", default=None)
    ap.add_argument("--poll", type=float, default=1.0)
    a = ap.parse_args(argv)
    os.umask(0o077)   # unpacked jobs and their files may hold [env] secrets
    agent = Agent(a.store, a.worker, a.accelerator or "", a.tpu, poll=a.poll)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    agent.run_forever()


if __name__ == "__main__":
    main()
