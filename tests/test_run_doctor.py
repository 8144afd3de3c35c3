"""The run doctor (issue 60): a run that stops moving is noticed (tpuctl/host/stall.py), every host's job's stacks
are saved (host/stacks.py through runtime/stacks.py's faulthandler), run.stalled is sent, and `submit --on-stall`
restarts or stops it. On the local provider with its real agent, tiny jobs and windows of a second or so."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import until
from jobs import make_job
from tpuctl.core import goodput, layout, runs
from tpuctl.host.stall import StallWatch
from tpuctl.providers.stores import open_store

WINDOW = 1.0   # TPUCTL_STALL_SECONDS in these tests: the start-up window is 3 s

# Reports STEPS steps through tpuctl.runtime (STEP_SECONDS apart, after BUSY seconds of silent work: a compile),
# then sleeps in wait_forever (the frame the stacks must name) unless EXIT_AFTER is set.
STEPPING_JOB = """
import os, sys, time
from tpuctl import runtime

def compile_for(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass

def wait_forever():
    time.sleep(600)

compile_for(float(os.environ.get("BUSY", "0")))
p = runtime.Progress(0)
for i in range(int(os.environ.get("STEPS", "3"))):
    t0 = time.monotonic()
    time.sleep(float(os.environ.get("STEP_SECONDS", "0.02")))
    p.step(i + 1, time.monotonic() - t0, loss=1.0 / (i + 1))
print("stepped", flush=True)
if os.environ.get("EXIT_AFTER"):
    sys.exit(0)
wait_forever()
"""


@pytest.fixture
def doctor_env(monkeypatch):
    for k, v in {"TPUCTL_STALL_SECONDS": str(WINDOW), "TPUCTL_STALL_POLL": "0.2", "TPUCTL_RESTART_BACKOFF": "0.02",
                 "TPUCTL_STOP_GRACE": "2", "TPUCTL_DRAIN_SECONDS": "1", "TPUCTL_TPU_METRICS_SECONDS": "0"}.items():
        monkeypatch.setenv(k, v)   # the local agent inherits them at `up`


def _job(tmp_path, **env):
    extra = "".join(f'{k} = "{v}"\n' for k, v in env.items())
    return make_job(tmp_path, STEPPING_JOB, "[env]\n" + extra if extra else "")


def _row(cli, name):
    return json.loads(cli("jobs", "-c", name, "--json")[1])[0]


def _store(st):
    return open_store(st.spec.store)


def _submit(cli, name, job, *flags, within=30):
    """Submitted detached and followed until it ends, within `within` seconds (a run the doctor misses would
    otherwise hang the test): (its log, its row)."""
    code, out, err = cli("submit", str(job), "-c", name, "--detach", *flags)
    assert code == 0, err
    final = {s.value for s in runs.RunState if s.final}
    until(lambda: _row(cli, name)["state"] in final, within, "the run's end", every=0.2)
    return cli("logs", out.strip(), "-c", name)[1], _row(cli, name)


def test_a_job_that_stops_stepping_is_restarted_once_then_ends_stalled(doctor_env, local_up, cli, tmp_path):
    st = local_up("dr")
    out, row = _submit(cli, "dr", _job(tmp_path), "--max-restarts", "1")
    assert row["exit_code"] == 143   # the stalled job's own exit: the SIGTERM it got
    assert row["state"] == "stalled" and row["restarts"] == 1 and row["failure"] == "stalled", row
    assert out.count("stepped") == 2 and "the run stalled" in out and "restart 1 of 1" in out
    store = _store(st)
    stalls = runs.stalls(store, row["id"])
    assert [s["action"] for s in stalls] == ["restart", "stop"], stalls
    for s in stalls:   # seen within two windows of the job's last progress
        assert s["at"] - s["since"] < 2 * WINDOW, s
    stacks = (store.read(layout.run_stacks(row["id"], 0)) or b"").decode()
    assert "wait_forever" in stacks and "faulthandler" in stacks and "process tree" in stacks, stacks
    code, shown, _ = cli("logs", row["id"], "-c", "dr", "--stacks")
    assert code == 0 and "stacks-w0.txt" in shown and "wait_forever" in shown
    # goodput: the stalled time is badput `stalled`, not a disruption
    assert row["goodput_parts"]["stalled_seconds"] >= 2 * WINDOW * 0.8, row["goodput_parts"]
    assert row["goodput_parts"]["disruption_seconds"] < 0.5
    # the event, recorded and listed on the run's page
    from tpuctl.ui import runview
    said = [e["what"] for e in runview.events(store, row["id"])]
    assert sum(w.startswith("stalled on") for w in said) == 2, said
    assert any(w.startswith("failed with") and "(cause: stalled)" in w for w in said), said


def test_on_stall_stop_ends_the_run_stalled_at_once(doctor_env, local_up, cli, tmp_path):
    local_up("dr")
    out, row = _submit(cli, "dr", _job(tmp_path), "--max-restarts", "3", "--on-stall", "stop")
    assert row["state"] == "stalled" and row["restarts"] == 0 and row["stalled_since"], row
    assert "stalled since" in cli("jobs", "-c", "dr")[1]


def test_on_stall_notify_keeps_the_run_and_shows_it_stalled(doctor_env, local_up, cli, tmp_path):
    local_up("dr")
    code, out, err = cli("submit", str(_job(tmp_path)), "-c", "dr", "--on-stall", "notify", "--detach")
    run_id = out.strip()
    until(lambda: _row(cli, "dr")["stalled_since"], 20, "the run shown stalled", every=0.2)
    row = _row(cli, "dr")
    assert row["state"] == "running" and not row["exit_code"], row   # it runs on, stalled
    assert "running, stalled since" in cli("jobs", "-c", "dr")[1]
    assert run_id in json.loads(cli("status", "-c", "dr", "--json")[1])["stalled"]
    assert cli("cancel", run_id, "-c", "dr")[0] == 0
    until(lambda: _row(cli, "dr")["state"] == "cancelled", 20, "the cancel", every=0.2)


def test_a_silent_compile_shorter_than_the_start_up_window_is_not_a_stall(doctor_env, local_up, cli, tmp_path,
                                                                          monkeypatch):
    """Busy 2.5 s (over the 1.5 s window, under the 4.5 s start-up window) with no output and no step, then steps."""
    monkeypatch.setenv("TPUCTL_STALL_SECONDS", "1.5")
    st = local_up("dr")
    code, out, err = cli("submit", str(_job(tmp_path, BUSY="2.5", STEPS="5", EXIT_AFTER="1")), "-c", "dr")
    assert code == 0, (out, err)
    row = _row(cli, "dr")
    assert row["state"] == "succeeded" and not runs.stalls(_store(st), row["id"]), row


def test_a_slow_but_steady_job_is_never_stalled(doctor_env, local_up, cli, tmp_path):
    """Steps 1.3x the window apart: the window grows to 10 step times once the job reports one."""
    st = local_up("dr")
    code, out, err = cli("submit", str(_job(tmp_path, STEPS="4", STEP_SECONDS=str(1.3 * WINDOW), EXIT_AFTER="1")),
                         "-c", "dr")
    assert code == 0, (out, err)
    assert not runs.stalls(_store(st), _row(cli, "dr")["id"])


def test_stall_after_off_leaves_a_run_alone(doctor_env, local_up, cli, tmp_path):
    local_up("dr")
    code, out, err = cli("submit", str(_job(tmp_path)), "-c", "dr", "--stall-after", "off", "--detach")
    time.sleep(5 * WINDOW)
    assert _row(cli, "dr")["state"] == "running"
    assert cli("cancel", out.strip(), "-c", "dr")[0] == 0


def test_stall_after_and_on_stall_are_checked(local_up, cli, tmp_path):
    job = str(_job(tmp_path))
    code, out, err = cli("submit", job, "-c", "nope", "--stall-after", "5s")
    assert code == 2 and "under 10 seconds" in err
    code, out, err = cli("submit", job, "-c", "nope", "--on-stall", "reboot")
    assert code == 2 and "notify, restart or stop" in err


# -- the rule, alone -------------------------------------------------------------------------------------------
def _p(step, calls, last, start=100.0, n=1, first=0.1):
    return (n, float(step), float(calls), float(last), start, first)


def test_rule_steps_window_and_startup(monkeypatch):
    monkeypatch.setenv("TPUCTL_STALL_SECONDS", "60")
    w = StallWatch(100.0)
    w.observe(100.0, None, 0)
    assert w.deadline() == 100.0 + 180   # before a step: the start-up window, 3 windows
    w.observe(150.0, None, 10)           # output before the first step pushes it on only past the start-up
    assert w.deadline() == 280.0
    w.observe(270.0, None, 20)
    assert w.deadline() == 330.0
    w.observe(300.0, _p(1, 1, 299.0), 20)
    assert w.stepped and w.deadline() == 360.0
    w.observe(310.0, _p(2, 2, 309.0), 99)   # 10 s a step: 10x is 100 s, over the 60 s window
    assert w.window() == 100.0 and w.deadline() == 410.0
    w.observe(400.0, _p(2, 2, 309.0), 500)  # output does not count once it steps
    assert not w.stalled(409.0) and w.stalled(410.0)


def test_rule_an_earlier_attempts_steps_are_not_this_ones(monkeypatch):
    monkeypatch.setenv("TPUCTL_STALL_SECONDS", "60")
    w = StallWatch(1000.0)
    w.observe(1000.5, _p(30, 30, 990.0, start=900.0), 0)   # what the restarted job found: not its own
    assert not w.stepped
    w.observe(1001.0, _p(30, 0, 1000.8, start=1000.8, n=2), 0)   # its begin: alive, no step yet
    assert not w.stepped and w.deadline() == 1000.0 + 180
    w.observe(1002.0, _p(31, 1, 1001.9, start=1000.8, n=2), 0)
    assert w.stepped and w.deadline() == 1062.0


def test_rule_a_stall_after_is_the_window(monkeypatch):
    w = StallWatch(0.0, stall_after=20.0)
    assert w.startup() == 60.0
    w.observe(1.0, _p(1, 1, 1.0, start=0.5, first=30.0), 0)
    assert w.window() == 20.0   # given: not stretched by step times


def test_goodput_counts_a_stall_as_its_own_badput():
    attempts = [{"start": 0.0, "from": 0.0, "step": 3.0, "last": 3.0, "step_seconds": 3.0, "calls": 3.0,
                 "first_seconds": 1.0},
                {"start": 10.0, "from": 0.0, "step": 3.0, "last": 13.0, "step_seconds": 3.0, "calls": 3.0,
                 "first_seconds": 1.0}]
    plain = goodput.breakdown(attempts, 0.0, 20.0)
    assert plain["disruption_seconds"] == 7.0 and plain["stalled_seconds"] == 0.0
    stalled = goodput.breakdown(attempts, 0.0, 20.0, [3.2, 13.1])
    assert stalled["disruption_seconds"] == 0.0 and stalled["stalled_seconds"] == 7.0 + 7.0


# -- two hosts ------------------------------------------------------------------------------------------------
# Worker 1 hangs "in a collective" (a sleep in all_reduce) after its steps; worker 0, which reports the run's
# steps, waits for it (a sleep in wait_for_peer). The first start hangs; the second exits 0.
TWO_HOST_JOB = """
import os, sys, time
from tpuctl import runtime
w, out = os.environ["TPUCTL_WORKER"], os.environ["TPUCTL_OUTPUT_DIR"]
p = os.path.join(out, f"starts-w{w}")
n = len(open(p).read().splitlines()) if os.path.exists(p) else 0
open(p, "a").write(f"{n}\\n")

def all_reduce():
    time.sleep(600)

def wait_for_peer():
    time.sleep(600)

prog = runtime.Progress(0)
for i in range(3):
    prog.step(i + 1, 0.01)
    time.sleep(0.02)
if n:
    sys.exit(0)
all_reduce() if w == "1" else wait_for_peer()
"""


def second_host(st, store, tmp_path):
    """The local cluster made a two-host JAX slice: its record says two hosts, and worker 1's agent starts here."""
    record = json.loads(store.read(layout.CLUSTER_RECORD))
    record.update(hosts=2, slices=1, coordinator="127.0.0.1", framework="jax")
    store.write(layout.CLUSTER_RECORD, json.dumps(record).encode())
    env = dict(os.environ, TPUCTL_HOST="host-w1", TPUCTL_AGENT_HOME=str(tmp_path / "home-w1"))
    return subprocess.Popen([sys.executable, "-m", "tpuctl.agent", "--store", st.spec.store, "--worker", "1",
                             "--accelerator", "cpu", "--poll", "0.25"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)


def test_two_hosts_stall_both_stacks_saved_and_the_round_restarts_on_both(doctor_env, local_up, cli, tmp_path,
                                                                         monkeypatch):
    for k, v in {"TPUCTL_STALE_SECONDS": "3", "TPUCTL_LOG_POLL_MAX": "0.2"}.items():
        monkeypatch.setenv(k, v)
    st = local_up("dr2")
    store = _store(st)
    agent = second_host(st, store, tmp_path)
    try:
        job = make_job(tmp_path, TWO_HOST_JOB, 'framework = "jax"\n')
        out, row = _submit(cli, "dr2", job, "--max-restarts", "1")
        assert row["state"] == "succeeded", (row, out)
        run_id = row["id"]
        for w in (0, 1):
            out_dir = store.local_path(layout.run_output(run_id))
            assert open(os.path.join(out_dir, f"starts-w{w}")).read().split() == ["0", "1"]   # restarted on both
        stacks = {w: (store.read(layout.run_stacks(run_id, w)) or b"").decode() for w in (0, 1)}
        assert "wait_for_peer" in stacks[0] and "all_reduce" in stacks[1], stacks
        rounds = [json.loads(store.read(k)) for k, _ in store.list(layout.run_rounds(run_id)) if k.endswith(".json")]
        assert any(r.get("stalled") and r.get("counts") for r in rounds), rounds
        assert _row(cli, "dr2")["restarts"] == 1
        from tpuctl.ui import runview
        said = [e["what"] for e in runview.events(store, run_id)]
        assert sum(w.startswith("stalled on") for w in said) == 1, said   # once, whichever host saw it first
    finally:
        agent.terminate()
        agent.wait(30)


def test_autostop_counts_a_stalled_run_as_idle_once_notified(doctor_env, local_up, cli, tmp_path):
    """--on-stall notify: the run runs on, stalled; autostop's idle clock runs from the stall, and once it is due
    the stalled run ends (`stalled`) and then the compute."""
    from test_lifecycle import _wait_stopped
    local_up("da", "--autostop", "3s")
    out, row = _submit(cli, "da", _job(tmp_path), "--on-stall", "notify")
    assert row["state"] == "stalled" and "autostop" in out, (row, out)
    _wait_stopped("da", timeout=20)


def test_a_gke_pod_leaves_a_stalls_restart_to_its_jobset():
    """On GKE the JobSet restarts the run (host/attempt.py's run_one): a stall to restart exits the pod with the job's
    code (the pod failure policy restarts 143) instead of restarting the job inside it."""
    from types import SimpleNamespace

    from tpuctl.host.attempt import after_stall
    from tpuctl.host.doctor import Stall
    calls = []
    at = SimpleNamespace(a=SimpleNamespace(external_restarts=True), failure="", began=0.0,
                         _interrupted=lambda shipper, rc: calls.append(("interrupted", rc)) or rc,
                         _restart=lambda *a: calls.append(("restart",)), _end=lambda *a: calls.append(("end",)))
    job = runs.RunSpec(id="r", name="j", command="c", package="p", max_restarts=2)
    assert after_stall(at, None, Stall("why", 1.0, "restart"), 143, job, 0.0)[0] == 143
    assert calls == [("interrupted", 143)] and at.failure == "stalled"
    at.a.external_restarts = False
    after_stall(at, None, Stall("why", 1.0, "restart"), 143, job, 0.0)
    assert calls[-1] == ("restart",)


# A job that reports no steps and does not import tpuctl.runtime: its output is its progress. It prints, starts a
# child that is not Python (sleep), and waits for it.
SILENT_JOB = """
import subprocess
print("loading", flush=True)
subprocess.run(["sleep", "600"])
"""


def test_a_job_without_steps_stalls_on_its_output_and_its_processes_are_shown(doctor_env, local_up, cli, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent-py-spy-free:" + os.environ["PATH"])
    st = local_up("dr")
    out, row = _submit(cli, "dr", make_job(tmp_path, SILENT_JOB), "--on-stall", "stop")
    assert row["state"] == "stalled", row
    (stall,) = runs.stalls(_store(st), row["id"])
    assert stall["at"] - stall["since"] >= 3 * WINDOW - 0.5   # not before the start-up window (3 windows)
    assert "no step reported and no output" in stall["why"]
    stacks = (_store(st).read(layout.run_stacks(row["id"], 0)) or b"").decode()
    assert "sleep 600" in stacks and "wchan=" in stacks, stacks   # the process tree, with what each waits in
    assert "python" in stacks and "(no stack" in stacks or "py-spy" in stacks, stacks


def test_logs_stacks_of_a_run_that_never_stalled_says_so(doctor_env, local_up, cli, tmp_path):
    local_up("dr")
    out, row = _submit(cli, "dr", _job(tmp_path, EXIT_AFTER="1"))
    code, out, err = cli("logs", row["id"], "-c", "dr", "--stacks")
    assert code == 3 and "has no stacks" in err and "stall" in err


def test_stacks_of_a_python_process_named_otherwise_and_a_process_tree(tmp_path):
    """host/stacks.py alone: a console script's process is named for the script (here: /proc/self/comm rewritten),
    and is still asked for its stacks; its child that is not Python is in the tree with its wait channel."""
    from pathlib import Path

    from tpuctl.host import stacks
    code = ("import subprocess, time\nfrom tpuctl import runtime\nopen('/proc/self/comm', 'w').write('train')\n"
            "child = subprocess.Popen(['sleep', '60'])\ntime.sleep(0.5)\ndef hold():\n    print('ready', flush=True)\n"
            "    time.sleep(60)\nhold()\n")
    p = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, TPUCTL_STACKS_DIR=str(tmp_path)),
                         stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == b"ready"
        kids = [int(x) for x in open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()]
        text = stacks.dump([p.pid, *kids], Path(tmp_path))
        assert "sleep 60" in text and "wchan=" in text and len(text.split("\n--- pid")[0].splitlines()) == 3, text
        assert "in hold" in text and "faulthandler" in text, text
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def test_submit_down_ends_a_notified_stalled_run_and_the_compute(doctor_env, local_up, cli, tmp_path):
    from test_lifecycle import _wait_stopped
    local_up("dd")
    out, row = _submit(cli, "dd", _job(tmp_path), "--on-stall", "notify", "--down")
    assert row["state"] == "stalled" and "submit --down" in out, (row, out)
    _wait_stopped("dd", timeout=20)
