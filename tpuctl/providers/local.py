"""LocalProvider: the Provider contract (base.py) on this machine. The store is a directory under the user's data
directory; the "TPU" is whatever TensorFlow finds here; the host is a detached agent process that outlives the CLI.
Implements the contract in base.py; imports nothing from google-cloud.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..core import bounded, layout, locks, nvidiasmi, runs, state
from ..core.errors import ErrorKind, TpuctlError, bad_input
from ..core.models import ClusterSpec, ClusterState, HostFacts, Phase, ProviderName, cluster_record
from ..core.processes import running
from ..core.store import LocalStore
from .base import (Compute, Created, Enforcement, Placement, PlanRow, Price, Progress, Reporter, UpFlags, do_not_apply,
                   progress_of)


def data_home() -> Path:
    if os.environ.get("TPUCTL_HOME"):
        return Path(os.environ["TPUCTL_HOME"]) / "data"
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "tpuctl"


def accelerator() -> tuple[str, str]:
    """("gpu:N", "") when nvidia-smi lists GPUs, else ("cpu", why not, or "" where there is no nvidia-smi): decided
    without importing TensorFlow. nvidia-smi runs bounded (core/nvidiasmi.py): a hung one, or one whose children
    hold its output open, is given up at TPUCTL_NVIDIA_SMI_DEADLINE with its whole process group, and says so;
    subprocess.run's timeout left its children running and could wait for ever on one stuck in the driver."""
    try:   # decoded whatever it prints: a driver's bytes that are not UTF-8 crashed `up` (issue 58.4)
        ran = nvidiasmi.run(["-L"])
    except FileNotFoundError:
        return "cpu", ""
    except (OSError, bounded.Overran) as e:
        return "cpu", f"n/a ({e})"
    n = sum(1 for line in ran.out.splitlines() if line.startswith("GPU "))
    if n:
        return f"gpu:{n}", ""
    return "cpu", "" if ran.code == 0 else f"n/a (nvidia-smi -L exited {ran.code}: {ran.err.strip()[:200]})"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return ""  # a zombie is dead
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        pass
    try:  # no /proc (macOS); bounded: a wedged ps must not hang status, down or the revive beside every command
        ran = bounded.run_bounded(["ps", "-o", "command=", "-p", str(pid)], within=5)
        return ran.out if ran.code == 0 else ""
    except (OSError, bounded.Overran):
        return ""


class LocalProvider:
    """No zones, no grants, nothing billed: `up` makes a store directory and starts an agent process."""
    name = ProviderName.LOCAL
    store_noun = "store"
    grants = None
    inventory = None
    watcher_host = None
    remote_runs = None
    self_recovery = ""

    @staticmethod
    def root(cluster: str) -> Path:
        return data_home() / "clusters" / cluster / "store"

    # -- planning ------------------------------------------------------------------------------------
    def make_spec(self, name: str, flags: UpFlags) -> ClusterSpec:
        given = flags.given()
        if given:
            raise bad_input(do_not_apply(given, "--provider local"),
                            "the local provider runs on this machine: `tpuctl up --provider local -c NAME`")
        return ClusterSpec(name=name, provider=self.name, store=str(self.root(name)))

    def plan(self, spec: ClusterSpec) -> list[PlanRow]:
        return [PlanRow("store", spec.store, "this machine"), PlanRow("agent", f"agent for {spec.name}", "this machine")]

    def price(self, spec: ClusterSpec) -> Price:
        return Price(0.0, "free")

    def placements(self, spec: ClusterSpec) -> list[Placement]:
        return [Placement("", "")]

    # -- making and removing ---------------------------------------------------------------------------
    def preflight(self, spec: ClusterSpec) -> list[str]:
        return []

    def ensure_store(self, spec: ClusterSpec, region: str, progress: Progress) -> bool:
        return ensure_dir_store(spec, progress)

    def delete_store(self, st: ClusterState, progress: Progress) -> None:
        delete_dir_store(st, progress)

    def choose_runtime(self, spec: ClusterSpec, placement: Placement) -> str:
        return ""

    def ensure_compute(self, st: ClusterState, reporter: Reporter) -> Compute:
        """Start the agent unless it is already running (a dead one is restarted)."""
        progress = progress_of(reporter, "agent", st.name)
        if self.agent_alive(st):
            progress("running")
            return Compute([], st.host)
        if st.host.pid:
            progress("agent had died, restarting")
        logs = state.home() / "agents"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, TPUCTL_AGENT_HOME=str(data_home() / "clusters" / st.name / "work"))
        chips, why = accelerator()
        if why:   # jobs run on the CPU then: said, not silently
            progress(f"GPUs {why}: jobs run on the CPU")
        with open(logs / f"{st.name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tpuctl.agent", "--store", str(Path(st.spec.store)), "--accelerator",
                 chips, "--tpu", "", "--poll", "0.25"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        facts = HostFacts(pid=proc.pid)
        progress("running")
        started = ClusterState(spec=st.spec, host=facts)
        return Compute([Created("agent", st.name, lambda: self._stop(started, lambda s: None))], facts)

    def delete_compute(self, st: ClusterState, reporter: Reporter) -> None:
        self._stop(st, progress_of(reporter, "agent", st.name))

    def _stop(self, st: ClusterState, progress: Progress) -> None:
        if not self.agent_alive(st):
            return
        pid = st.host.pid
        progress("stopping")
        # the agent gives its running job SIGTERM and the stop grace to checkpoint, records the run interrupted
        # (`down` then ends it), and exits
        os.kill(pid, signal.SIGTERM)
        if not _wait_exit(pid, runs.stop_grace() + 15):
            os.kill(pid, signal.SIGKILL)
            _wait_exit(pid, 5)
        progress("deleted")

    def write_cluster_record(self, st: ClusterState, confirmed: bool) -> None:
        self.store(st).write(layout.CLUSTER_RECORD, json.dumps(cluster_record(st, "", teardown="exit"),
                                                                indent=2).encode())

    # -- using ---------------------------------------------------------------------------------------
    def store(self, st: ClusterState) -> LocalStore:
        return LocalStore(st.spec.store)

    def agent_alive(self, st: ClusterState) -> bool:
        """True only when the recorded pid is running AND is the agent started for this store (pids get reused)."""
        if not st.host.pid:
            return False
        cmd = _cmdline(st.host.pid)
        return "tpuctl.agent" in cmd and str(Path(st.spec.store)) in cmd

    def revive(self, st: ClusterState, reporter: Reporter) -> ClusterState:
        """What systemd does for a TPU host's agent: one that died (killed, a crash, the machine restarted) is
        started again, under the cluster's lock so that two commands never start two."""
        if st.phase is not Phase.READY or self.agent_alive(st):
            return st
        with locks.cluster_lock(st.name, "tpuctl (restarting the local agent)", reporter.warn):
            now = state.load(st.name) or st
            if self.agent_alive(now):
                return now
            now.host = self.ensure_compute(now, reporter).facts
            state.save(now)
        reporter.warn(f"the local agent of {st.name} (pid {st.host.pid}) was not running: restarted it "
                      f"(pid {now.host.pid}); its log is {state.home() / 'agents' / (st.name + '.log')}")
        return now

    def check_ready(self, st: ClusterState) -> None:
        if not self.agent_alive(st):
            raise TpuctlError(ErrorKind.NOT_FOUND, f"the agent of local cluster {st.name} is not running",
                              f"run `tpuctl up -c {st.name} --provider local` to restart it")

    def location(self, st: ClusterState) -> str:
        return "this machine"

    def host_state(self, st: ClusterState) -> tuple[bool, str]:
        if self.agent_alive(st):
            return True, f"the local agent (pid {st.host.pid}) is running but has not taken the run over yet"
        return False, f"the local agent (pid {st.host.pid}) is not running"

    def problem(self, st: ClusterState) -> tuple[str, str] | None:
        if self.agent_alive(st):
            return None
        return (f"the local agent (pid {st.host.pid}) is not running: submitted runs wait",
                f"tpuctl up -c {st.name} --provider local")

    def compute_lost(self, st: ClusterState) -> str | None:
        return None if self.agent_alive(st) else f"the local agent (pid {st.host.pid}) is gone"

    def enforcement(self, st: ClusterState) -> Enforcement:
        return Enforcement(True, f"the agent on this machine (pid {st.host.pid})")

    def ssh_argv(self, st: ClusterState, worker: int, command: str) -> list[str]:
        raise bad_input(f"cluster {st.name} runs on this machine: there is no remote host to open a shell on",
                        f"its agent's log is {state.home() / 'agents' / (st.name + '.log')}")

    def summary(self, st: ClusterState) -> dict[str, object]:
        return {}

    def describe(self, st: ClusterState) -> dict[str, dict[str, object]]:
        return {"agent": {"state": "running" if self.agent_alive(st) else "DEAD", "pid": st.host.pid},
                "store": {"path": st.spec.store, "state": "READY" if Path(st.spec.store).is_dir() else "MISSING"}}

    def teardown_list(self, st: ClusterState) -> list[str]:
        return [f"the local agent of {st.name}"]


def ensure_dir_store(spec: ClusterSpec, progress: Progress) -> bool:
    """A store that is a directory on this machine (the local and Kaggle providers'); True when made now."""
    p = Path(spec.store)
    created = not p.is_dir()
    p.mkdir(parents=True, exist_ok=True)
    progress("ready")
    return created


def delete_dir_store(st: ClusterState, progress: Progress) -> None:
    """The store directory, and the cluster's folder around it (its agent's work directory)."""
    p = Path(st.spec.store)
    if p.is_dir():
        progress("deleting")
        shutil.rmtree(p.parent if p.name == "store" and p.parent.parent.name == "clusters" else p)


def _wait_exit(pid: int, seconds: float) -> bool:
    """Wait for the process to exit, reaping it when it is our own child (the CLI in one process, as in tests)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass   # not our child: its parent (init, once the `up` that started it has exited) reaps it
        if not running(pid):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
