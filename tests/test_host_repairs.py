"""A run across the hosts of a 2 slices x 2 hosts Multislice that outlives Google's own repairs and a lost host
(issue 39 items 1 and 2; tpuctl/host/claims.py, rounds.py). Four real agent processes share one local store, as four
TPU VMs share a bucket; a host's "reboot" kills its agent and every process of its job at once (what a power-off does,
tests/fakes/tpu_host.py Host.stop) and starts the agent again in a new boot (TPUCTL_BOOT_ID, hostboot.py)."""
import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from fakes.tpu_host import kill_agent_home
from jobs import make_job
from test_rounds import Cluster
from tpuctl.core import layout, packaging, runindex, runs
from tpuctl.core.store import LocalStore

FAST = {"TPUCTL_STALE_SECONDS": "2", "TPUCTL_STOP_GRACE": "1", "TPUCTL_LOG_POLL_MAX": "0.2",
        "TPUCTL_DRAIN_SECONDS": "0.5"}
HOSTS = [(k, w) for k in range(2) for w in range(2)]

# Each start appends a line to its host's count file in the run's output (it survives, as a checkpoint does). Start 0
# waits for DEAD (the test killed a peer), then 1 s (JAX's own notice of a dead peer), and exits EXIT_<worker> ("abort":
# SIGABRT, 134); every start waits for GO and exits 0.
JOB = """
import os, sys, time
w, out = os.environ["TPUCTL_WORKER"], os.environ["TPUCTL_OUTPUT_DIR"]
p = os.path.join(out, f"starts-w{w}")
n = len(open(p).read().splitlines()) if os.path.exists(p) else 0
open(p, "a").write(f"{n} slice={os.environ['MEGASCALE_SLICE_ID']} restarts={os.environ['TPUCTL_RESTARTS']}\\n")
print(f"start {n} w{w}", flush=True)
code = os.environ.get(f"EXIT_{w}") if n == 0 else None
while not os.path.exists(os.environ["GO"]):
    if code and os.path.exists(os.environ["DEAD"]):
        time.sleep(1)
        os.abort() if code == "abort" else sys.exit(int(code))
    time.sleep(0.1)
"""


class Hosts(Cluster):
    """test_rounds.Cluster's views of the run (starts, statuses, log, until, stop), over four agents of its own."""

    def __init__(self, tmp_path, monkeypatch):
        for k, v in FAST.items():
            monkeypatch.setenv(k, v)
        self.tmp, self.root = tmp_path, tmp_path / "store"
        self.store = LocalStore(self.root)
        self.store.write(layout.CLUSTER_RECORD, json.dumps(
            {"name": "ms", "hosts": 2, "slices": 2, "coordinator": "127.0.0.1", "framework": "jax"}).encode())
        self.agents = {}
        for k, w in HOSTS:
            self.boot(k, w)

    def home(self, k, w):
        return self.tmp / f"home-s{k}w{w}"

    def boot(self, k, w):
        """The host's agent in a new boot of its machine, as its systemd unit starts it."""
        env = dict(os.environ, TPUCTL_HOST=f"host-s{k}w{w}", TPUCTL_AGENT_HOME=str(self.home(k, w)),
                   TPUCTL_BOOT_ID=uuid.uuid4().hex)
        log = open(self.tmp / f"agent-s{k}w{w}.log", "ab")
        self.agents[k, w] = subprocess.Popen(
            [sys.executable, "-m", "tpuctl.agent", "--store", str(self.root), "--slice", str(k), "--worker",
             str(w), "--accelerator", "cpu", "--poll", "0.2"], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def power_off(self, k, w):
        """The agent and every process of its job, at once (jobs run in sessions of their own)."""
        self.agents[k, w].send_signal(signal.SIGKILL)
        self.agents[k, w].wait()
        kill_agent_home(self.home(k, w))

    def submit(self, env):
        job = make_job(self.tmp, JOB)
        pkg, sha = packaging.build(job)
        self.store.create(layout.job_package(sha), pkg)
        run_id = runs.new_id()
        spec = runs.RunSpec(id=run_id, name="job", command="python main.py", package=sha, framework="jax",
                            env={"GO": str(self.tmp / "go"), "DEAD": str(self.tmp / "dead"), **env})
        self.store.create(layout.run_job(run_id), json.dumps(spec.to_json()).encode())
        runindex.register(self.store, run_id)
        return run_id


@pytest.fixture
def hosts(tmp_path, monkeypatch):
    h = Hosts(tmp_path, monkeypatch)
    yield h
    h.stop()


def test_ten_google_repairs_in_a_row_never_spend_the_runs_attempts(hosts):
    """Each repair: slice K's hosts reboot on healthy hardware, then every other slice restarts (Multislice
    "Autorepair"). Every host takes the run over in a new boot: attempt 11, none of them charged, no restart."""
    run_id = hosts.submit({})
    for r in range(10):
        hosts.until(lambda: all(len(hosts.starts(run_id, i)) == r + 1 for i in range(4)), 60,
                    f"every host's start {r + 1}")
        for k, w in sorted(HOSTS, key=lambda h: h[0] != r % 2):   # the repaired slice, then the other
            hosts.power_off(k, w)
            hosts.boot(k, w)
    (hosts.tmp / "go").write_text("")
    hosts.until(lambda: all(s.state.final for s in hosts.statuses(run_id)), 60, "the run to end")
    for i, st in enumerate(hosts.statuses(run_id)):
        assert st.state.value == "succeeded" and st.restarts == 0 and st.attempt == 11, (i, st, hosts.log(run_id, i))
        assert len(hosts.starts(run_id, i)) == 11 and hosts.starts(run_id, i)[-1].endswith("restarts=0"), i
        assert json.loads(hosts.store.read(layout.run_claim(run_id, i, 11)))["charged"] == 1


def test_an_agent_restarted_on_a_live_host_is_charged(hosts):
    """The same boot: not Google's doing (a crash, an OOM kill): the attempt counts, so a run that keeps taking its
    agent down still ends LOST."""
    run_id = hosts.submit({})
    hosts.until(lambda: all(hosts.starts(run_id, i) for i in range(4)), 60, "every host's first start")
    boot = hosts.agents[1, 1].args
    hosts.agents[1, 1].send_signal(signal.SIGKILL)
    hosts.agents[1, 1].wait()
    env = dict(os.environ, TPUCTL_HOST="host-s1w1", TPUCTL_AGENT_HOME=str(hosts.home(1, 1)),
               TPUCTL_BOOT_ID=json.loads(hosts.store.read(layout.run_claim(run_id, 3)))["boot"])
    hosts.agents[1, 1] = subprocess.Popen(boot, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    hosts.until(lambda: hosts.store.read(layout.run_claim(run_id, 3, 2)) is not None, 60, "the takeover")
    assert json.loads(hosts.store.read(layout.run_claim(run_id, 3, 2)))["charged"] == 2
    (hosts.tmp / "go").write_text("")
    hosts.until(lambda: all(s.state.final for s in hosts.statuses(run_id)), 60, "the run to end")


def test_survivors_that_exit_1_or_abort_after_a_peer_is_killed_restart_the_run_unspent(hosts):
    """s1/w1 powered off; a second later the others' jobs end as JAX's would without their peer: 1 (an exception),
    134 (an abort). That is the lost host, not the job's failure: round 2 everywhere, --max-restarts 0 unspent."""
    run_id = hosts.submit({"EXIT_0": "1", "EXIT_1": "abort", "EXIT_2": "1"})
    hosts.until(lambda: all(hosts.starts(run_id, i) for i in range(4)), 60, "every host's first start")
    hosts.power_off(1, 1)
    (hosts.tmp / "dead").write_text("")
    hosts.until(lambda: all("waiting for s1/w1" in hosts.statuses(run_id)[i].note for i in range(3)), 60,
                "the survivors to wait for s1/w1")
    hosts.boot(1, 1)                              # Google brings the host back
    hosts.until(lambda: all(len(hosts.starts(run_id, i)) == 2 for i in range(4)), 60, "round 2 on every host")
    (hosts.tmp / "go").write_text("")
    hosts.until(lambda: all(s.state.final for s in hosts.statuses(run_id)), 60, "the run to end")
    for i, st in enumerate(hosts.statuses(run_id)):
        assert st.state.value == "succeeded" and st.restarts == 0, (i, st)
    assert "s1/w1 went quiet" in hosts.log(run_id, 0), hosts.log(run_id, 0)
