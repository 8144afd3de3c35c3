"""Failures sorted by cause (tpuctl/host/failures.py; issue 60 item 3): a test per row of the table, from log tails
as libtpu, XLA and JAX print them (the sources failures.py cites), and on the local provider an HBM OOM that is
not restarted and a libtpu lockfile left behind that is cleared."""
import json

import pytest

from jobs import make_job
from tpuctl.core import layout
from tpuctl.host import failures
from tpuctl.providers.stores import open_store

TAILS = {
    "oom": [
        "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
        "space hbm. Used 21.90G of 7.48G hbm. Exceeded hbm capacity by 14.42G.",
        "Program hbm requirement 63.80G:\n    global            3.05M\n",
        "Largest program allocations in hbm:\n  1. Size: 2.00G",
        "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 4.39G. That was not possible. "
        "There are 2.30G free.; (0x0x0_HBM0)",
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem.",
    ],
    "device-busy": [
        "I0000 The TPU is already in use by process with pid 4242. Not attempting to load libtpu.so in this process.",
        'The TPU is already in use by another process probably owned by another user. Run "$ sudo lsof -w '
        '/dev/accel0" to figure out which process is using the TPU. If you still get this message, run "$ sudo rm '
        '/tmp/libtpu_lockfile".',
        "libtpu.so already in use by another process probably owned by another user.",
    ],
    "no-tpu": [
        "Failed to initialize TPU system with error: FAILED_PRECONDITION: open(/dev/vfio/0) failed\nNo accelerator "
        "found. Please run on a TPU or GPU",
        "RuntimeError: Unable to initialize backend 'tpu': INTERNAL: Failed to get global TPU topology. (set "
        "JAX_PLATFORMS='' to automatically choose an available backend)",
        "TPU initialization failed: open(/dev/accel3): Operation not permitted: Operation not permitted; Couldn't "
        "open device: /dev/accel3",
    ],
    "coordinator": [
        "DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: PjRT_Client_Connect. Timed out task names: "
        "/job:jax_worker/replica:0/task:1",
        "Stopping coordination service as cluster registration failed. ... Barrier timed out. Id: "
        "[Init]Wait_for_all_tasks_to_register::0",
        "UNAVAILABLE: Task /job:jax_worker/replica:0/task:0 heartbeat timeout. This indicates that the remote task "
        "has failed, got preempted, or crashed unexpectedly.",
        "UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was preempted/died/restarted "
        "unexpectedly or this task is experiencing network issues.",
    ],
    "job": [
        "Traceback (most recent call last):\n  File \"main.py\", line 3, in <module>\nKeyError: 'labels'",
        "",
    ],
}


@pytest.mark.parametrize("cause,tail", [(c, t) for c, ts in TAILS.items() for t in ts])
def test_each_row_from_a_log_tail(cause, tail):
    f = failures.classify(1, "some earlier output\n" + tail + "\nmore output\n")
    assert f.cause == cause, (f, tail)
    assert f.hint
    if cause != "job":
        assert f.line and f.line in tail   # the line that told it is quoted


def test_host_oom_is_exit_137_with_the_kernels_kill_only():
    assert failures.classify(137, "Killed", host_oom=True).cause == "oom"
    assert failures.classify(137, "Killed").cause == "job"   # a SIGKILL of someone else's
    assert failures.classify(1, "", host_oom=True).cause == "job"


@pytest.mark.parametrize("seen", ["preempted", "lost-host", "stalled"])
def test_the_rows_the_agent_tells_itself(seen):
    f = failures.classify(143, "The TPU is already in use", seen=seen)
    assert f.cause == seen and f.hint and f.restartable is None


def test_what_each_cause_does():
    assert failures.Failure("oom", "").restartable is False
    assert failures.Failure("device-busy", "").restartable is True
    assert failures.Failure("no-tpu", "").restartable is True
    assert failures.Failure("coordinator", "").restartable is None
    assert failures.Failure("job", "").restartable is None


def test_first_row_wins_an_oom_that_ended_the_heartbeats():
    tail = TAILS["oom"][0] + "\n" + TAILS["coordinator"][2]
    assert failures.classify(1, tail).cause == "oom"


def test_the_lockfile_is_cleared_only_when_nobody_holds_it(tmp_path, monkeypatch):
    lock = tmp_path / "libtpu_lockfile"
    monkeypatch.setenv("TPUCTL_LIBTPU_LOCKFILE", str(lock))
    assert "no " in failures.clear_lockfile()
    lock.write_text("")
    with open(lock):
        assert "held by pid" in failures.clear_lockfile() and lock.exists()
    assert "removed" in failures.clear_lockfile() and not lock.exists()


def test_oom_kills_reads_the_cgroup():
    assert isinstance(failures.oom_kills(), int)


# memory.events of a cgroup v2 memory cgroup, as the kernel writes it (Documentation/admin-guide/cgroup-v2.rst,
# "memory.events": low, high, max, oom, oom_kill, oom_group_kill; one "key value" a line)
MEMORY_EVENTS = "low 0\nhigh 0\nmax {n}\noom {n}\noom_kill {n}\noom_group_kill 0\n"
AGENT_CGROUP = "/system.slice/tpuctl-agent.service"   # the agent's systemd unit (templates/startup.sh)


def cgroup_v2(tmp_path, monkeypatch, kills=0):
    """A fixture cgroup v2 tree: /proc/self/cgroup naming the agent's unit on the unified hierarchy, and that
    cgroup's memory.events; returns the events file."""
    (tmp_path / "proc_cgroup").write_text(f"0::{AGENT_CGROUP}\n")
    events = tmp_path / "cgroup" / AGENT_CGROUP.strip("/") / "memory.events"
    events.parent.mkdir(parents=True)
    events.write_text(MEMORY_EVENTS.format(n=kills))
    monkeypatch.setenv("TPUCTL_PROC_CGROUP", str(tmp_path / "proc_cgroup"))
    monkeypatch.setenv("TPUCTL_CGROUP_ROOT", str(tmp_path / "cgroup"))
    return events


def test_oom_kills_reads_memory_events_on_cgroup_v2_v1_and_a_container(tmp_path, monkeypatch):
    events = cgroup_v2(tmp_path, monkeypatch, kills=2)
    assert failures.oom_kills() == 2
    events.write_text(MEMORY_EVENTS.format(n=3))
    assert failures.oom_kills() == 3
    # in a container's own cgroup namespace (a GKE pod) its cgroup is "/", mounted at the root
    (tmp_path / "proc_cgroup").write_text("0::/\n")
    (tmp_path / "cgroup" / "memory.events").write_text(MEMORY_EVENTS.format(n=5))
    assert failures.oom_kills() == 5
    # a hybrid host: the unified line has no memory controller; v1's memory.oom_control answers (its oom_kill
    # since Linux 4.13)
    (tmp_path / "proc_cgroup").write_text("4:memory:/agent\n1:name=systemd:/agent\n0::/agent\n")
    v1 = tmp_path / "cgroup" / "memory" / "agent"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    assert failures.oom_kills() == 7
    (tmp_path / "proc_cgroup").write_text("0::/elsewhere\n")
    assert failures.oom_kills() == -1   # nothing readable: no host OOM is told


# -- on the local provider ------------------------------------------------------------------------------------
OOM_JOB = """
import os, sys
p = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "starts")
open(p, "a").write("x")
print("Program hbm requirement 63.80G:", flush=True)
print("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm.", flush=True)
sys.exit(134)   # an abort: restartable by exit code, yet an OOM is not restarted
"""

# A job that finds libtpu's lockfile there fails as libtpu does; once it is gone, it succeeds. ALWAYS_BUSY: it
# fails whatever (a TPU another process really holds).
LOCK_JOB = """
import os, sys
if os.path.exists(os.environ["TPUCTL_LIBTPU_LOCKFILE"]) or os.environ.get("ALWAYS_BUSY"):
    print("The TPU is already in use by process with pid 4242. Not attempting to load libtpu.so in this process.",
          flush=True)
    sys.exit(1)
print("trained", flush=True)
"""


@pytest.fixture
def local(local_up, monkeypatch, tmp_path):
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", "0.02")
    monkeypatch.setenv("TPUCTL_LIBTPU_LOCKFILE", str(tmp_path / "libtpu_lockfile"))
    return local_up("fl")


def _row(cli):
    return json.loads(cli("jobs", "-c", "fl", "--json")[1])[0]


def test_an_hbm_oom_is_not_restarted_whatever_max_restarts_says(local, cli, tmp_path):
    code, out, err = cli("submit", str(make_job(tmp_path, OOM_JOB)), "-c", "fl", "--max-restarts", "3")
    assert code == 134, err
    row = _row(cli)
    assert row["state"] == "failed" and row["failure"] == "oom" and row["restarts"] == 0, row
    out_dir = open_store(local.spec.store).local_path(layout.run_output(row["id"]))
    assert open(f"{out_dir}/starts").read() == "x"
    assert "the job failed (oom" in out and "smaller batch" in out and "--type" in out
    assert "failed (oom)" in cli("jobs", "-c", "fl")[1]
    from tpuctl.ui import runview
    said = [e["what"] for e in runview.events(open_store(local.spec.store), row["id"])]
    assert any(w.startswith("failed with") and "(cause: oom)" in w for w in said), said


# The kernel's OOM killer ends the job (SIGKILL: exit 137) and counts the kill in the agent's cgroup: here the job
# counts it in the fixture tree itself, then dies of SIGKILL as the killer's victim does.
HOST_OOM_JOB = """
import os, re, signal
p = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "starts")
open(p, "a").write("x")
events = os.environ["EVENTS"]
text = open(events).read()
n = int(re.search(r"oom_kill (\\d+)", text).group(1)) + 1
open(events, "w").write(re.sub(r"oom_kill \\d+", f"oom_kill {n}", text))
print("loading the whole data set into memory", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_host_oom_on_cgroup_v2_is_not_restarted(local_up, cli, tmp_path, monkeypatch):
    events = cgroup_v2(tmp_path, monkeypatch)   # before `up`: the local agent reads it
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", "0.02")
    local = local_up("fl")
    job = make_job(tmp_path, HOST_OOM_JOB, f'[env]\nEVENTS = "{events}"\n')
    code, out, err = cli("submit", str(job), "-c", "fl", "--max-restarts", "3")
    assert code == 137, out + err
    row = _row(cli)
    assert row["state"] == "failed" and row["failure"] == "oom" and row["restarts"] == 0, row
    out_dir = open_store(local.spec.store).local_path(layout.run_output(row["id"]))
    assert open(f"{out_dir}/starts").read() == "x"   # started once: --max-restarts 3 notwithstanding
    assert "killed by the kernel's OOM killer" in out and "more host RAM" in out, out
    assert "oom_kill 1" in events.read_text()


def test_a_lockfile_left_behind_is_cleared_and_the_next_start_runs(local, cli, tmp_path):
    lock = tmp_path / "libtpu_lockfile"
    lock.write_text("")
    code, out, err = cli("submit", str(make_job(tmp_path, LOCK_JOB)), "-c", "fl")   # --max-restarts 0
    assert code == 0, out + err
    assert "the job failed (device-busy" in out and "removed" in out and "trained" in out
    assert not lock.exists()
    row = _row(cli)
    assert row["state"] == "succeeded" and row["restarts"] == 0, row


def test_a_tpu_busy_twice_on_one_host_marks_it_sick(local, cli, tmp_path):
    job = make_job(tmp_path, LOCK_JOB, '[env]\nALWAYS_BUSY = "1"\n')
    code, out, err = cli("submit", str(job), "-c", "fl", "--max-restarts", "2")
    assert code == 1
    row = _row(cli)
    assert row["state"] == "failed" and row["failure"] == "device-busy" and row["restarts"] == 0, row
    assert "the host is marked sick" in out
    store = open_store(local.spec.store)
    sick = [json.loads(store.read(k)) for k, _ in store.list("tpuctl/sick/")]
    assert len(sick) == 1 and "device-busy" in sick[0]["why"], sick
    assert sick[0]["host"] in json.loads(cli("status", "-c", "fl", "--json")[1])["sick"]


def test_a_sick_hosts_run_waits_for_the_recovery_watcher_when_armed(local_up, cli, tmp_path, monkeypatch):
    """Armed for recovery (`up --recover`), a sick host's run is not failed at once: it restarts here, uncounted,
    while the watcher replaces the host (control/watch.py; this machine is not replaced), up to SICK_RESTARTS."""
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", "0.01")
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF_MAX", "0.05")
    monkeypatch.setenv("TPUCTL_LIBTPU_LOCKFILE", str(tmp_path / "libtpu_lockfile"))
    local_up("fl", "--recover")
    job = make_job(tmp_path, LOCK_JOB, '[env]\nALWAYS_BUSY = "1"\n')
    code, out, err = cli("submit", str(job), "-c", "fl")
    assert code == 1
    starts = [line for line in out.splitlines() if line.startswith("The TPU is already in use")]
    assert len(starts) == failures.SICK_RESTARTS + 1, out
    assert "the recovery watcher replaces it" in out
    row = _row(cli)
    assert row["state"] == "failed" and row["failure"] == "device-busy" and row["restarts"] == 0, row
