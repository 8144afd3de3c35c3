"""Preemption recovery: a run whose host stopped heartbeating is taken over by the next agent (the one on the
recreated TPU VM), with the same run id and output directory, its log continuing where it stopped."""
import json
import threading
import time

import pytest

from conftest import until
from jobs import make_job, submit_to_store
from tpuctl.core import layout, runs
from tpuctl.host.agent import Agent
from tpuctl.core.store import LocalStore

# Counts to 6, one step a line, keeping its progress in TPUCTL_OUTPUT_DIR as a checkpoint would.
RESUMABLE = """
import os
ckpt = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "step")
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print("resuming at", start, flush=True)
for step in range(start + 1, 7):
    open(ckpt, "w").write(str(step))
    print("step", step, flush=True)
"""


def _preempted_midway(store, run_id, tmp_path):
    """What a TPU VM preempted after step 3 leaves in the store: its claim, a stale heartbeat, its log so far."""
    store.create(layout.run_claim(run_id, 0), json.dumps({"host": "t1v-old", "time": time.time() - 600}).encode())
    store.write(layout.run_status(run_id, 0), json.dumps(
        {"state": "running", "host": "t1v-old", "heartbeat": time.time() - 600, "attempt": 1}).encode())
    store.create(layout.log_chunk(run_id, 0, 1), b"resuming at 0\nstep 1\nstep 2\nstep 3\n")
    out = tmp_path / "store" / "runs" / run_id / "output"
    out.mkdir(parents=True)
    (out / "step").write_text("3")


def _agent(store_dir, tmp_path):
    a = Agent(str(store_dir), home=str(tmp_path / "agent"), poll=0.05)
    t = threading.Thread(target=a.run_forever, daemon=True)
    t.start()
    return a, t


def test_a_stale_run_is_resumed_by_the_next_agent(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "60")
    store = LocalStore(tmp_path / "store")
    run_id = submit_to_store(store, make_job(tmp_path, RESUMABLE))
    _preempted_midway(store, run_id, tmp_path)
    a, t = _agent(tmp_path / "store", tmp_path)
    try:
        out = []
        st = runs.follow(store, run_id, out.append, sleep=lambda s: time.sleep(min(s, 0.1)))
    finally:
        a.stop.set()
        t.join(10)
    text = b"".join(out).decode()
    assert st.state is runs.RunState.SUCCEEDED and st.attempt == 2
    assert text.startswith("resuming at 0\nstep 1\nstep 2\nstep 3\n")
    assert "run resumed on" in text and "(attempt 2)" in text
    assert "resuming at 3\nstep 4\nstep 5\nstep 6\n" in text
    assert text.count("step 3\n") == 1          # nothing ran twice
    assert store.read(layout.run_claim(run_id, 0, 2)) is not None


def test_a_live_run_is_not_taken_over(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "60")
    store = LocalStore(tmp_path / "store")
    run_id = submit_to_store(store, make_job(tmp_path, RESUMABLE))
    store.create(layout.run_claim(run_id, 0), json.dumps({"host": "t1v-live", "time": time.time()}).encode())
    store.write(layout.run_status(run_id, 0), json.dumps(
        {"state": "running", "host": "t1v-live", "heartbeat": time.time()}).encode())
    agent = Agent(str(tmp_path / "store"), home=str(tmp_path / "agent"))
    assert agent.tick() is False
    assert runs.status(store, run_id).host == "t1v-live"


def test_a_run_that_keeps_losing_its_host_ends_lost(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "60")
    store = LocalStore(tmp_path / "store")
    run_id = submit_to_store(store, make_job(tmp_path, RESUMABLE))
    store.create(layout.run_claim(run_id, 0), json.dumps({"host": "x", "time": 0}).encode())
    store.write(layout.run_status(run_id, 0), json.dumps(
        {"state": "running", "host": "x", "heartbeat": 0, "attempt": 3}).encode())
    agent = Agent(str(tmp_path / "store"), home=str(tmp_path / "agent"))
    assert agent.tick() is False
    assert runs.status(store, run_id).state is runs.RunState.LOST


def test_only_worker_0_takes_over_a_tensorflow_run_on_a_slice(tmp_path, monkeypatch):
    """On a multi-host TensorFlow slice workers 1..N-1 serve the TPU runtime: a stale run is worker 0's to resume."""
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "60")
    store = LocalStore(tmp_path / "store")
    store.write(layout.CLUSTER_RECORD, json.dumps({"arch": "vm", "hosts": 4, "framework": "tensorflow",
                                                   "tpu_name": "tpuctl-s"}).encode())
    run_id = submit_to_store(store, make_job(tmp_path, RESUMABLE))
    _preempted_midway(store, run_id, tmp_path)
    for worker in (1, 2, 3):
        a = Agent(str(tmp_path / "store"), worker=worker, home=str(tmp_path / f"agent{worker}"))
        a.read_record()
        assert a.tick() is False and a.serves_only()
    assert [k for k, _ in store.list(layout.run_prefix(run_id)) if "-w" in k] == []   # nothing claimed
    a0, t = _agent(tmp_path / "store", tmp_path)
    try:
        st = runs.follow(store, run_id, lambda b: None, sleep=lambda s: time.sleep(min(s, 0.1)))
    finally:
        a0.stop.set()
        t.join(10)
    assert st.state is runs.RunState.SUCCEEDED and st.attempt == 2 and st.worker == 0


# Saves its step on SIGTERM and exits 143, as a job that checkpoints at a preemption notice does; its first attempt
# stops at step 3 (and tells the test so) until it is stopped.
CHECKPOINTS_ON_SIGTERM = """
import os, signal, sys, time
ckpt = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "step")
first = not os.path.exists(ckpt)
step = 0 if first else int(open(ckpt).read())
print("resuming at", step, flush=True)
def save(*_):
    open(ckpt, "w").write(str(step))
    print("saved at", step, flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
while step < 6:
    step += 1
    print("step", step, flush=True)
    if first and step == 3:
        open(os.environ["TPUCTL_OUTPUT_DIR"] + "/at3", "w").close()
        time.sleep(120)
print("done", flush=True)
"""


def _systemd_agent(store_dir, tmp_path, host, **extra):
    """The agent as a host's systemd starts it (templates/startup.sh): `python -m tpuctl.agent`, its own process."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, TPUCTL_AGENT_HOME=str(tmp_path / host), TPUCTL_STOP_GRACE="10", TPUCTL_HOST=host,
               TPUCTL_STALE_SECONDS="600", **extra)   # a take-over that waited for staleness would not come here
    return subprocess.Popen([sys.executable, "-m", "tpuctl.agent", "--store", str(store_dir), "--poll", "0.1"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


@pytest.mark.parametrize("kill_mode", ["mixed", "control-group"])
def test_a_host_stopping_its_agent_interrupts_the_run_and_the_next_agent_resumes_it(tmp_path, kill_mode):
    """systemd stopping the agent (a reboot, maintenance, a preemption notice) is not a cancel: the job gets its
    SIGTERM and saves, the attempt is recorded interrupted, and the next agent resumes the run at once from its
    checkpoint. With KillMode=mixed (the unit's) only the agent is signalled; with control-group (systemd's default,
    and a shutdown's final SIGTERM to all) the job is signalled at the same moment and may exit 143 first."""
    import os
    import signal
    store = LocalStore(tmp_path / "store")
    run_id = submit_to_store(store, make_job(tmp_path, CHECKPOINTS_ON_SIGTERM))
    first = _systemd_agent(tmp_path / "store", tmp_path, "t1v-n-1-w-0")
    at3 = tmp_path / "store" / "runs" / run_id / "output" / "at3"
    until(at3.exists, 60, "the job's step 3")
    if kill_mode == "mixed":
        os.kill(first.pid, signal.SIGTERM)
    else:
        # the job's pid read first: once signalled, the agent may record the attempt interrupted (no pid) at once
        job = until(lambda: runs.status(store, run_id).pid, 30, "the job's pid in its status")
        os.killpg(first.pid, signal.SIGTERM)   # the agent's session...
        os.killpg(job, signal.SIGTERM)          # ...and the job's, started as a session of its own
    assert first.wait(30) == 0
    st = runs.status(store, run_id)
    assert st.state is runs.RunState.INTERRUPTED and not st.state.final and st.exit_code == 143, st
    assert "stopped" in st.note
    assert (tmp_path / "store" / "runs" / run_id / "output" / "step").read_text() == "3"
    second = _systemd_agent(tmp_path / "store", tmp_path, "t1v-n-2-w-0")   # the host re-created after preemption
    try:
        until(lambda: runs.status(store, run_id).state.final, 60, "the resumed run's end")
    finally:
        second.terminate()
        second.wait(30)
    out = []
    st = runs.follow(store, run_id, out.append, follow=False)
    text = b"".join(out).decode()
    assert st.state is runs.RunState.SUCCEEDED and st.exit_code == 0 and st.attempt == 2, (st, text)
    assert "step 3\nsaved at 3\n" in text                       # shipped before the first agent exited
    assert "host stopped; run resumed on t1v-n-2-w-0 (attempt 2)" in text
    assert "resuming at 3\nstep 4\nstep 5\nstep 6\ndone\n" in text
    assert text.count("step 3\n") == 1


# A job's last words after a quiet spell, then a marker for the test, then nothing until it is killed.
LAST_WORDS = """
import os, time
print("warming up", flush=True)
time.sleep(3)
print("saving checkpoint 7", flush=True)
open(os.environ["TPUCTL_OUTPUT_DIR"] + "/said", "w").close()
time.sleep(120)
"""


def test_a_hard_preemption_loses_no_line_printed_after_a_quiet_spell(tmp_path):
    """Issue 28.2: the host SIGKILLed (no SIGTERM: the agent gets no word) right after the job's last line; that
    line is in the log, shipped within a fraction of a second, not after a flush interval. A chunk at most every 2 s (TPUCTL_LOG_FLUSH_SECONDS) limits chatty output only: a line
    after a quiet spell leaves at once."""
    import os
    import signal
    store = LocalStore(tmp_path / "store")
    run_id = submit_to_store(store, make_job(tmp_path, LAST_WORDS))
    agent = _systemd_agent(tmp_path / "store", tmp_path, "t1v-n-1-w-0", TPUCTL_LOG_FLUSH_SECONDS="2")
    said = tmp_path / "store" / "runs" / run_id / "output" / "said"
    try:
        until(said.exists, 60, "the job's last words", every=0.01)
        printed = time.monotonic()
        while b"checkpoint 7" not in b"".join(store.read(k) or b"" for k, _ in store.list(layout.run_logs(run_id, 0))):
            assert time.monotonic() - printed < 0.4, "the line after a quiet spell waited to be shipped"
            time.sleep(0.01)
    finally:
        job = runs.status(store, run_id).pid
        for group in (agent.pid, job):
            try:
                os.killpg(group, signal.SIGKILL)   # power off: everything at once
            except (ProcessLookupError, TypeError):
                pass
        agent.wait(10)
    out = []
    runs.follow(store, run_id, out.append, follow=False)
    assert b"".join(out) == b"warming up\nsaving checkpoint 7\n"


# A job whose checkpoint takes a while: its SIGTERM handler is mid-save (mid-line) for a second.
SLOW_SAVE = """
import signal, sys, time
def save(*_):
    sys.stdout.write("saved at")
    sys.stdout.flush()
    time.sleep(1)
    print(" 3", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_stop_signals_the_jobs_main_process_once_so_its_handler_never_runs_twice(tmp_path, monkeypatch):
    """Issue 38.10, `saved atsaved at 3`: bash -c execs the job's last command, so the job is the main process and
    is also found in its own session; signalled twice, its SIGTERM handler ran again inside itself when the second
    signal came after the first was taken. Forced here: each kill is followed by a pause, so the handler is always
    mid-save when another signal could come."""
    import os
    import signal
    import subprocess
    import sys
    from tpuctl.host.jobprocs import JobProcesses
    job = tmp_path / "job.py"
    job.write_text(SLOW_SAVE)
    proc = subprocess.Popen(["bash", "-c", f"set -e\nset +e\n{sys.executable} {job}\n"], stdout=subprocess.PIPE,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    try:
        assert proc.stdout.readline() == b"ready\n"
        real_kill, sent = os.kill, []

        def kill_then_pause(pid, sig):
            real_kill(pid, sig)
            sent.append(pid)
            time.sleep(0.3)   # the job's handler has begun its save before anything else is sent
        monkeypatch.setattr(os, "kill", kill_then_pause)
        JobProcesses(proc.pid, pipe_inode=os.fstat(proc.stdout.fileno()).st_ino).signal(signal.SIGTERM)
        monkeypatch.undo()
        assert proc.stdout.read() == b"saved at 3\n"
        assert proc.wait(10) == 143 and sent.count(proc.pid) == 1
    finally:
        proc.kill()
        proc.wait()


def test_an_agent_killed_before_its_run_said_running_is_taken_over_at_once_by_its_successor(tmp_path, monkeypatch):
    """Issue 38.11: an agent SIGKILLed right at run.started leaves the attempt `starting`, with no job pid yet, and
    perhaps the job itself running. The next agent on the host ended only attempts with a pid, and trusted this
    one until it went stale (TPUCTL_STALE_SECONDS): the run sat in `starting`. It is the dead agent's (this host's
    own), so it is ended and resumed at once; the job left behind is found by its environment."""
    import os
    import subprocess
    import sys
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "600")
    monkeypatch.setenv("TPUCTL_HOST", "t1v-same")
    store = LocalStore(tmp_path / "store")
    run_id = submit_to_store(store, make_job(tmp_path, RESUMABLE))
    store.create(layout.run_claim(run_id, 0), json.dumps({"host": "t1v-same", "time": time.time()}).encode())
    store.write(layout.run_status(run_id, 0), json.dumps(
        {"state": "starting", "host": "t1v-same", "heartbeat": time.time(), "attempt": 1}).encode())
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                            env=dict(os.environ, TPUCTL_RUN_ID=run_id, TPUCTL_WORKER="0"))
    a, t = _agent(tmp_path / "store", tmp_path)
    try:
        until(lambda: runs.status(store, run_id).state.final, 20, "the run taken over and ended")
        assert left.wait(10) is not None                 # the job the dead agent left was ended first
    finally:
        a.stop.set()
        t.join(10)
        left.kill()
        left.wait()
    st = runs.status(store, run_id)
    assert st.state is runs.RunState.SUCCEEDED and st.attempt == 2, st
