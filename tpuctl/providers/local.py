"""LocalProvider: the Provider contract (base.py) on this machine. The store is a directory under the user's data
directory; the "TPU" is whatever TensorFlow finds here; the host is a detached agent process that outlives the CLI.
Imports nothing from google-cloud.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from .. import state
from ..errors import TpuctlError
from ..models import ClusterState
from ..store import LocalStore


def data_home() -> Path:
    if os.environ.get("TPUCTL_HOME"):
        return Path(os.environ["TPUCTL_HOME"]) / "data"
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "tpuctl"


def accelerator() -> str:
    """gpu:N when nvidia-smi lists GPUs, else cpu: decided without importing TensorFlow."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "cpu"
    n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return f"gpu:{n}" if n else "cpu"


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return ""  # a zombie is dead
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        pass
    try:  # no /proc (macOS)
        return subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return ""


class LocalProvider:
    name = "local"

    @staticmethod
    def root(cluster: str) -> Path:
        return data_home() / "clusters" / cluster / "store"

    def store(self, st: ClusterState) -> LocalStore:
        return LocalStore(st.bucket)

    def agent_alive(self, st: ClusterState) -> bool:
        """True only when st.host_pid is running AND is the agent started for this store (pids get reused)."""
        if not st.host_pid:
            return False
        cmd = _cmdline(st.host_pid)
        return "tpuctl.agent" in cmd and str(Path(st.bucket)) in cmd

    def ensure_bucket(self, spec, bucket, region, progress) -> bool:
        p = Path(bucket)
        created = not p.is_dir()
        p.mkdir(parents=True, exist_ok=True)
        progress("ready")
        return created

    def ensure_host(self, st: ClusterState, progress) -> bool:
        """Start the agent unless it is already running; True when started."""
        if self.agent_alive(st):
            progress("running")
            return False
        if st.host_pid:
            progress("agent had died, restarting")
        logs = state.home() / "agents"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, TPUCTL_AGENT_HOME=str(data_home() / "clusters" / st.name / "work"))
        with open(logs / f"{st.name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tpuctl.agent", "--store", str(Path(st.bucket)), "--accelerator",
                 accelerator(), "--tpu", "", "--poll", "0.25"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        st.host_pid = proc.pid
        progress("running")
        return True

    def delete_tpu(self, st: ClusterState, progress) -> None:
        if not self.agent_alive(st):
            return
        progress("stopping")
        os.kill(st.host_pid, signal.SIGTERM)   # the agent stops its running job (5 s grace), then exits
        deadline = time.monotonic() + 15
        while self.agent_alive(st) and time.monotonic() < deadline:
            _reap(st.host_pid)
            time.sleep(0.05)
        if self.agent_alive(st):
            os.kill(st.host_pid, signal.SIGKILL)
        _reap(st.host_pid)
        progress("deleted")

    def delete_vm(self, st, progress) -> None:
        pass

    def revoke(self, bucket, grants) -> None:
        pass

    def delete_bucket(self, bucket: str, cluster: str, progress) -> None:
        p = Path(bucket)
        if p.is_dir():
            progress("deleting")
            shutil.rmtree(p.parent if p.name == "store" and p.parent.parent.name == "clusters" else p)

    def write_cluster_record(self, bucket: str, record: dict) -> None:
        import json
        LocalStore(bucket).write("tpuctl/cluster.json", json.dumps(record, indent=2).encode())

    def check_ready(self, st: ClusterState) -> None:
        if not self.agent_alive(st):
            raise TpuctlError("not_found", f"the agent of local cluster {st.name} is not running",
                              f"run `tpuctl up -c {st.name} --provider local` to restart it")

    def describe(self, st: ClusterState) -> dict:
        return {"agent": {"state": "running" if self.agent_alive(st) else "DEAD", "pid": st.host_pid},
                "store": {"path": st.bucket, "state": "READY" if Path(st.bucket).is_dir() else "MISSING"}}


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)  # only succeeds when the agent is our own child (tests, one process)
    except ChildProcessError:
        pass
