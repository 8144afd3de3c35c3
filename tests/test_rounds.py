"""One run across many hosts, restarted whole (tpuctl/host/rounds.py; issue 31 items 4 and 5): four real agent
processes, two slices of two hosts, share one local store, as four TPU VM hosts share a bucket. A host's job that
exits 42, a host's agent killed (and, later, started again as systemd would), one host failing: every host stops
and starts its job together, and the run's restarts are counted once."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import until
from jobs import make_job
from tpuctl.core import layout, runs
from tpuctl.providers.stores import open_store

FAST = {"TPUCTL_STALE_SECONDS": "2", "TPUCTL_STOP_GRACE": "2", "TPUCTL_LOG_POLL_MAX": "0.2",
        "TPUCTL_DRAIN_SECONDS": "1"}

# Each start appends a line to the host's own count file in the run's output (what survives, as a checkpoint does);
# EXIT_<worker>=a,b,... is the exit code of that worker's starts, then 0; SLEEP_<worker>_<n>, else SLEEP_<n>, else
# SLEEP, how long start n sleeps.
JOB = """
import os, sys, time
w, out = os.environ["TPUCTL_WORKER"], os.environ["TPUCTL_OUTPUT_DIR"]
p = os.path.join(out, f"starts-w{w}")
n = len(open(p).read().splitlines()) if os.path.exists(p) else 0
open(p, "a").write(f"{n} slice={os.environ['MEGASCALE_SLICE_ID']} restarts={os.environ['TPUCTL_RESTARTS']}\\n")
print(f"start {n} w{w}", flush=True)
time.sleep(float(os.environ.get(f"SLEEP_{w}_{n}") or os.environ.get(f"SLEEP_{n}") or os.environ.get("SLEEP", "1")))
codes = os.environ.get(f"EXIT_{w}", "").split(",")
sys.exit(int(codes[n]) if n < len(codes) and codes[n] else 0)
"""


class Cluster:
    """A local cluster whose record says 2 slices x 2 hosts: the provider's own agent is slice 0's worker 0, and
    three more agent processes stand in for the other hosts (`python -m tpuctl.agent --slice K --worker W`)."""

    def __init__(self, local_up, tmp_path, monkeypatch, *flags):
        for k, v in FAST.items():
            monkeypatch.setenv(k, v)
        self.st = local_up("rounds", *flags)
        self.store = open_store(self.st.spec.store)
        record = json.loads(self.store.read(layout.CLUSTER_RECORD))
        record.update(hosts=2, slices=2, coordinator="127.0.0.1", framework="jax")
        self.store.write(layout.CLUSTER_RECORD, json.dumps(record).encode())
        self.tmp, self.agents = tmp_path, {}
        for k, w in ((0, 1), (1, 0), (1, 1)):
            self.start(k, w)

    def start(self, k, w):
        """The host's agent, as its systemd unit starts it (again, after it died: Restart=always)."""
        env = dict(os.environ, TPUCTL_HOST=f"host-s{k}w{w}", TPUCTL_AGENT_HOME=str(self.tmp / f"home-s{k}w{w}"))
        log = open(self.tmp / f"agent-s{k}w{w}.log", "ab")
        self.agents[k, w] = subprocess.Popen(
            [sys.executable, "-m", "tpuctl.agent", "--store", self.st.spec.store, "--slice", str(k), "--worker",
             str(w), "--accelerator", "cpu", "--poll", "0.25"], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def kill(self, k, w):
        """SIGKILL to the agent alone: its job, in a session of its own, runs on (as after an OOM kill)."""
        self.agents[k, w].send_signal(signal.SIGKILL)
        self.agents[k, w].wait()

    def stop(self):
        for p in self.agents.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.agents.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()

    def starts(self, run_id, worker):
        p = os.path.join(self.store.local_path(layout.run_output(run_id)), f"starts-w{worker}")
        return open(p).read().splitlines() if os.path.exists(p) else []

    def statuses(self, run_id):
        return [runs.status(self.store, run_id, i) for i in range(4)]

    def log(self, run_id, worker):
        return b"".join(self.store.read(k) or b"" for k, _ in self.store.list(layout.run_logs(run_id, worker))).decode()

    def until(self, cond, timeout, what):
        def agents():
            logs = "".join((self.tmp / f).read_text(errors="replace") for f in os.listdir(self.tmp)
                           if f.startswith("agent-"))
            return f"{what}\n{logs[-4000:]}"
        until(cond, timeout, agents, every=0.1)


@pytest.fixture
def cluster(local_up, tmp_path, monkeypatch):
    c = Cluster(local_up, tmp_path, monkeypatch)
    yield c
    c.stop()


def _submit(cli, tmp_path, env, *flags):
    extra = 'framework = "jax"\n[env]\n' + "".join(f'{k} = "{v}"\n' for k, v in env.items())
    code, out, err = cli("submit", str(make_job(tmp_path, JOB, extra)), "-c", "rounds", "--detach", *flags)
    assert code == 0, err
    return out.strip()


def test_a_job_exiting_42_on_one_host_restarts_the_run_on_every_host_counted_once(cluster, cli, tmp_path):
    run_id = _submit(cli, tmp_path, {"EXIT_3": "42", "EXIT_2": "42"}, "--max-restarts", "1")
    cluster.until(lambda: all(s.state.final for s in cluster.statuses(run_id)), 90, "the run to end")
    for i, st in enumerate(cluster.statuses(run_id)):
        assert st.state.value == "succeeded" and st.restarts == 1, (i, st)
        assert [l.split()[0] for l in cluster.starts(run_id, i)] == ["0", "1"], i   # every host started twice
        assert cluster.starts(run_id, i)[1].endswith("restarts=1")
    assert "the run restarts on every host (round 2" in cluster.log(run_id, 0)
    assert json.loads(cli("jobs", "-c", "rounds", "--json")[1])[0]["restarts"] == 1


def test_a_restart_past_the_limit_fails_the_run_on_every_host(cluster, cli, tmp_path):
    run_id = _submit(cli, tmp_path, {"EXIT_1": "42,42", "SLEEP": "30", "SLEEP_1_0": "1", "SLEEP_1_1": "1"}, "--max-restarts", "1")
    cluster.until(lambda: all(s.state.final for s in cluster.statuses(run_id)), 90, "the run to end")
    sts = cluster.statuses(run_id)
    assert [s.state.value for s in sts] == ["failed"] * 4 and {s.exit_code for s in sts} == {42}
    assert "the run failed on s0/w1" in sts[0].note
    assert all(len(cluster.starts(run_id, i)) == 2 for i in range(4))   # the others were stopped, not waited for


def test_a_dead_agent_stops_the_run_everywhere_until_its_host_is_back(cluster, cli, tmp_path):
    """Worker 0's job ends well early: it waits for the others (rounds.finish) and restarts with them."""
    run_id = _submit(cli, tmp_path, {"SLEEP_0": "60", "SLEEP_0_0": "0.5", "SLEEP": "1"})
    cluster.until(lambda: all(cluster.starts(run_id, i) for i in range(4)), 60, "every host to start")
    cluster.kill(1, 0)                                   # slice 1's worker 0: its agent gone, its host up
    cluster.until(lambda: all("waiting for s1/w0" in s.note for i, s in enumerate(cluster.statuses(run_id))
                              if i != 2), 60, "the other hosts to stop and wait for s1/w0")
    assert [len(cluster.starts(run_id, i)) for i in range(4)] == [1, 1, 1, 1]
    cluster.start(1, 0)                                  # systemd's Restart= brings the agent back
    cluster.until(lambda: all(s.state.final for s in cluster.statuses(run_id)), 90, "the run to end")
    for i, st in enumerate(cluster.statuses(run_id)):
        assert st.state.value == "succeeded" and st.restarts == 0, (i, st)   # a lost host is not counted
        assert len(cluster.starts(run_id, i)) == 2, i
    assert "s1/w0 went quiet" in cluster.log(run_id, 1) or "s1/w0 took the run over" in cluster.log(run_id, 1)


def test_a_run_waiting_for_a_lost_host_can_be_cancelled(cluster, cli, tmp_path):
    run_id = _submit(cli, tmp_path, {"SLEEP_0": "60"})
    cluster.until(lambda: all(cluster.starts(run_id, i) for i in range(4)), 60, "every host to start")
    cluster.kill(1, 1)
    cluster.until(lambda: "waiting for s1/w1" in cluster.statuses(run_id)[0].note, 60, "worker 0 to wait")
    assert "round 2: waiting for s1/w1 to be ready (3 of 4 hosts are)" in cli("jobs", "-c", "rounds")[2]
    assert cli("cancel", run_id, "-c", "rounds")[0] == 0
    cluster.until(lambda: all(s.state.final for i, s in enumerate(cluster.statuses(run_id)) if i != 3), 60,
                  "the waiting hosts to end")
    assert {s.state.value for i, s in enumerate(cluster.statuses(run_id)) if i != 3} == {"cancelled"}


def test_an_agent_restarted_at_once_restarts_the_run_on_every_host(cluster, cli, tmp_path):
    """Back before anyone saw it quiet: it ends what its predecessor left running and, having been part of the
    running round, asks for the next one (rounds.join), so its job never runs beside the others' first start."""
    run_id = _submit(cli, tmp_path, {"SLEEP_0": "8", "SLEEP": "1"})
    cluster.until(lambda: all(cluster.starts(run_id, i) for i in range(4)), 60, "every host to start")
    cluster.kill(0, 1)
    cluster.start(0, 1)
    cluster.until(lambda: all(s.state.final for s in cluster.statuses(run_id)), 90, "the run to end")
    assert [len(cluster.starts(run_id, i)) for i in range(4)] == [2, 2, 2, 2]
    assert {s.state.value for s in cluster.statuses(run_id)} == {"succeeded"}
    assert "s0/w1 took the run over" in cluster.log(run_id, 0)


def test_the_deadline_ends_a_run_waiting_for_a_lost_host_then_the_compute(local_up, cli, tmp_path, monkeypatch):
    """A host that never comes back must not keep the compute past --max-duration: worker 0 checks it while it
    waits, as it does while the job runs."""
    from test_lifecycle import _wait_stopped
    cluster = Cluster(local_up, tmp_path, monkeypatch, "--max-duration", "15s")
    try:
        run_id = _submit(cli, tmp_path, {"SLEEP_0": "60"})
        cluster.until(lambda: all(cluster.starts(run_id, i) for i in range(4)), 60, "every host to start")
        cluster.kill(1, 1)
        cluster.until(lambda: "waiting for s1/w1" in cluster.statuses(run_id)[0].note, 60, "worker 0 to wait")
        cluster.until(lambda: cluster.statuses(run_id)[0].state.final, 30, "the deadline to end the wait")
        st = cluster.statuses(run_id)[0]
        assert st.state.value == "cancelled" and "--max-duration deadline has come" in st.note, st
        _wait_stopped("rounds")
    finally:
        cluster.stop()
