"""`tpuctl drill` (control/drill.py, cli/drill.py) on its temporary local cluster, with tiny pure-Python jobs that
behave as real ones do under a preemption notice: one that never checkpoints, one that reads its SIGTERM flag only
between steps (goodfire-ai/spd#741: the save "fired 0/6 times" when the notice came during the first compile or a
save), and one that reads it in every phase. Plus the plan and the verdict as units."""
import json
import os
import sys
from pathlib import Path

import pytest

from jobs import make_job
from tpuctl.control import drill

# A training loop of its own: Progress reports start and step, checkpointing() reports save, phase("compile") the
# first step's compile. MODE: "none" (no checkpoints, SIGTERM kills it), "between" (the flag read only at the top of
# each step: a compile or a save outlasting the grace is killed), "every" (read in the compile and right after each
# save: exits at once when nothing is unsaved). DATA: "" (no data position reported), "keep" (a reader of 8 rows a
# step that skips the rows its checkpoint's steps read, and reports where it is), "rewind" (one that starts again
# from row 0 after a resume, as a reader without a skip does).
FIXTURE = """
import json, os, sys, time
from tpuctl import runtime
MODE = os.environ["MODE"]
STEPS, EVERY = int(os.environ.get("STEPS", "60")), 10
COMPILE, SAVE, STEP = float(os.environ.get("COMPILE", "3")), float(os.environ.get("SAVE", "1.2")), 0.05
ck = os.path.join(runtime.output_dir(), "ckpt.json")
# across hosts only the first process writes the checkpoint, as a real job's chief does (all read it)
CHIEF = os.environ.get("TPUCTL_WORKER", "0") == "0" and os.environ.get("MEGASCALE_SLICE_ID", "0") == "0"
if MODE != "none":
    runtime.listen_for_stop()
start = json.load(open(ck))["step"] if MODE != "none" and os.path.exists(ck) else 0
print("resumed", start, flush=True)
progress = runtime.Progress(start)
DATA = os.environ.get("DATA", "")
row = start * 8 if DATA == "keep" else 0
if DATA:
    runtime.data_position(start, row)

def out():
    print("stopped", flush=True)
    sys.exit(runtime.STOPPED_CODE)

def save(step):
    with progress.checkpointing():
        time.sleep(SAVE)
        if CHIEF:
            json.dump({"step": step}, open(ck + ".tmp", "w"))
            os.replace(ck + ".tmp", ck)

def wait(seconds):   # busy work that a careful job interrupts
    t = time.time()
    while time.time() - t < seconds:
        time.sleep(0.02)
        if MODE == "every" and runtime.stop_requested():
            out()   # nothing unsaved: the start's checkpoint is the step it began at

wait(0.6)
runtime.phase("compile", start)
wait(COMPILE)
for step in range(start + 1, STEPS + 1):
    if MODE == "between" and runtime.stop_requested():
        save(step - 1)
        out()
    t0 = time.perf_counter()
    time.sleep(STEP)
    row += 8
    if DATA:
        runtime.data_position(step, row)
    progress.step(step, time.perf_counter() - t0)
    if MODE != "none" and step % EVERY == 0:
        save(step)
    if MODE == "every" and runtime.stop_requested():
        if step % EVERY:
            save(step)
        out()
print("done", flush=True)
"""


@pytest.fixture
def job(env, tmp_path):
    def make(mode, **extra):
        values = {"MODE": mode, **{k: str(v) for k, v in extra.items()}}
        toml = "[env]\n" + "".join(f'{k} = "{v}"\n' for k, v in values.items())
        return make_job(tmp_path, FIXTURE, toml, name=f"job-{mode}")
    return make


def _drill(cli, job_dir, *flags):
    code, out, err = cli("drill", str(job_dir), "--json", *flags)
    return code, json.loads(out) if out.strip().startswith("[") else out, err


def test_a_job_without_checkpoints_fails_with_the_hint(cli, job):
    # 60 steps (3 s): the drill signals within its poll of the first step, and the restart from 0 redoes all 60
    code, report, err = _drill(cli, job("none", COMPILE=0.5), "--at", "step", "--grace", "2")
    assert code == 1, err
    [d] = report
    assert d["phase"] == "step" and d["signal"] == "SIGTERM" and d["passed"] is False
    # SIGTERM killed it at once (no handler), nothing saved: it started again from 0 and redid every step
    assert d["ended_in_grace"] is True and d["saved_in_grace"] is False and d["last_checkpoint"] is None
    assert d["resumed_from"] == 0 and d["redone"] >= 1 and d["redone"] >= d["step"]
    assert "no checkpoint written within the 2 s grace" in err and "save on SIGTERM, see docs/jobs.md" in err


def test_a_job_that_reads_its_flag_only_between_steps_fails_the_compile_and_save_drills(cli, job):
    code, report, err = _drill(cli, job("between"), "--at", "compile,step,save", "--grace", "2")
    assert code == 1, err
    by = {d["phase"]: d for d in report}
    assert by["compile"]["passed"] is False and by["compile"]["ended_in_grace"] is False
    assert by["step"]["passed"] is True and by["step"]["saved_in_grace"] is True and by["step"]["redone"] == 0, json.dumps(by)
    assert by["save"]["passed"] is False and by["save"]["ended_in_grace"] is False
    assert "drill compile (SIGTERM): still running 2 s after SIGTERM, in its compile phase" in err
    # each resumed from the checkpoint the store held when it was killed
    assert all(d["resumed_from"] == (d["last_checkpoint"] or 0) for d in report)


def test_a_job_that_saves_on_sigterm_in_every_phase_passes_and_a_phase_never_reached_fails_nothing(cli, job):
    code, report, err = _drill(cli, job("every", DATA="keep"), "--at", "start,compile,step,save,step:kill,eval",
                               "--grace", "2")
    assert code == 0, err
    assert [(d["phase"], d["signal"], d["passed"]) for d in report] == [
        ("start", "SIGTERM", True), ("compile", "SIGTERM", True), ("step", "SIGTERM", True),
        ("save", "SIGTERM", True), ("step", "SIGKILL", True), ("eval", "SIGTERM", None)], json.dumps(report)
    step, save, kill = report[2], report[3], report[4]
    assert step["saved_in_grace"] and step["resumed_from"] == step["last_checkpoint"] >= step["step"]
    assert save["redone"] == 0 and save["resumed_from"] == save["last_checkpoint"]
    # a lost host: back to the last checkpoint, at most one interval (10 steps) redone
    assert kill["resumed_from"] == kill["last_checkpoint"] and 0 <= kill["redone"] <= 10
    # the time to the next start's first step, and its compile (3 s here), where that start got so far (the one
    # after the start drill is the compile drill's)
    assert report[0]["to_first_step_s"] is None
    assert all(d["to_first_step_s"] > d["compile_s"] >= 3 for d in report[1:5])
    assert report[5]["why"].startswith("not reached")
    # each resumed reader began where an uninterrupted run's was at its step (the start drill's next start is the
    # compile drill's: signalled before its first step, its position is known all the same)
    assert [d["data"] for d in report] == ["same"] * 5 + [None], json.dumps(report)


def test_a_job_whose_reader_starts_again_from_its_first_row_after_a_resume_fails(cli, job):
    code, report, err = _drill(cli, job("every", DATA="rewind", COMPILE=0.5), "--at", "step", "--grace", "2")
    assert code == 1, err
    [d] = report
    assert d["passed"] is False and d["data"] == "different" and d["resumed_from"] == d["last_checkpoint"] > 0
    # its reader began at row 0 at the checkpoint's step, where an uninterrupted run's had read 8 a step
    err = " ".join(err.split())
    assert f"its reader began at 0 at step {d['resumed_from']}, where an uninterrupted run's was at " \
        f"{8 * d['resumed_from']}" in err and "runtime.data_position (docs/jobs.md)" in err



def test_on_an_existing_cluster_the_agent_signals_the_job_and_restarts_it_no_host_removed(cli, job, local_up,
                                                                                          monkeypatch):
    """-c CLUSTER: the drill writes its request to the store and the cluster's own agent delivers it at its cancel
    check (once a second: the save lasts 2.5 s here so that the signal lands in it), then restarts the job."""
    monkeypatch.setenv("TPUCTL_PROGRESS_SECONDS", "0.2")   # the agent and its jobs inherit these at `up`
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", "0")
    monkeypatch.setenv("TPUCTL_DRILL_WAIT", "60")
    from tpuctl.core import layout, state
    from tpuctl.core.store import LocalStore
    st = local_up("held")
    code, report, err = _drill(cli, job("every", COMPILE=0.5, SAVE=2.5, STEPS=70), "-c", "held",
                               "--at", "step,save,step:kill", "--grace", "3")
    assert code == 0, err
    assert [(d["phase"], d["signal"], d["passed"]) for d in report] == [
        ("step", "SIGTERM", True), ("save", "SIGTERM", True), ("step", "SIGKILL", True)], json.dumps(report)
    step, save, kill = report
    assert step["ended_in_grace"] and step["saved_in_grace"] and step["redone"] == 0
    assert save["ended_in_grace"] and save["resumed_from"] == save["last_checkpoint"] and save["redone"] == 0
    assert kill["resumed_from"] == kill["last_checkpoint"] and 0 <= kill["redone"] <= 10
    # the agent answered each request, and the cluster is still there, its agent the same: nothing was deleted
    run_id = err.split("drill: run ")[1].split()[0]
    store = LocalStore(st.spec.store)
    answers = [json.loads(store.read(layout.run_drill_done(run_id, n)) or b"{}") for n in range(3)]
    assert [a.get("signal") for a in answers] == ["SIGTERM", "SIGTERM", "SIGKILL"], answers
    assert answers[1]["phase"] == "save" and all(a["ended"] >= a["signalled"] for a in answers)
    assert state.load("held") is not None and cli("status", "-c", "held")[0] == 0
    # and in the run's events (`tpuctl ui`'s run page), as sentences
    from tpuctl.ui import runview
    said = [e["what"] for e in runview.events(store, run_id)]
    assert any(s.startswith("drill: SIGTERM to the job in its save phase at step ") and s.endswith(
        "SIGKILL after 3 s") for s in said), "\n".join(said)
    assert any(s.startswith("drill save (SIGTERM): passed: resumed from step ") for s in said), said
    assert any(s.startswith("drill step (SIGKILL): passed") for s in said), said


def test_a_job_that_reports_no_phases_is_drilled_by_time_and_the_report_says_so(cli, env, tmp_path):
    quiet = make_job(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(4)\n", name="quiet")
    code, out, err = cli("drill", str(quiet), "--at", "step", "--by-time", "1", "--grace", "1")
    assert code == 0, err
    assert "pass (by time)" in out and "drilled by time: the job reports no phases" in err


def test_the_plan():
    assert [d.label for d in drill.plan(None)] == ["start", "compile", "step", "save", "step:kill", "eval"]
    assert drill.plan("save,step:kill") == [drill.Drill("save"), drill.Drill("step", "kill")]
    assert drill.plan(None, 3, seed=1) == drill.plan(None, 3, seed=1) and len(drill.plan(None, 3, seed=1)) == 3
    from tpuctl.core.errors import TpuctlError
    with pytest.raises(TpuctlError, match="not a phase"):
        drill.plan("warmup")


def test_the_verdict():
    o = drill.Outcome("step", "SIGKILL", reached=True, resumed_from=20, last_checkpoint=20, redone=12)
    drill.judge(o, 30, 10)
    assert not o.passed and "12 steps redone, more than one checkpoint interval (10)" in o.why
    o = drill.Outcome("step", "SIGKILL", reached=True, resumed_from=20, last_checkpoint=30, redone=5)
    drill.judge(o, 30, 10)
    assert not o.passed and o.why.startswith("resumed from step 20, not its last checkpoint (step 30)")
    o = drill.Outcome("save", "SIGTERM", reached=True, resumed_from=30, last_checkpoint=30, redone=0,
                      saved_in_grace=True, ended_in_grace=True)
    drill.judge(o, 30, 10)
    assert o.passed and o.why == ""
    # the interval: gaps within one start, from the step it resumed from (a save on SIGTERM at 13 is off-cadence)
    assert drill.interval({0: (0, {10, 13}), 1: (13, {20}), 2: (20, set())}) == 10 and drill.interval({}) is None



def test_the_job_reports_phases_and_its_saves_under_tpuctl_only(tmp_path, monkeypatch):
    import subprocess
    code = """
import json, os, signal, sys
from tpuctl import runtime
runtime.listen_for_stop()
os.kill(os.getpid(), signal.SIGTERM)   # a flag now, not the end of the process
p = runtime.Progress(7, path=sys.argv[1] + "/metrics.json")
runtime.phase("compile", 7)
with p.checkpointing():
    doc = json.load(open(sys.argv[1] + "/phase.json"))
    assert doc["phase"] == "save", doc
print(runtime.stop_requested(), json.dumps(json.load(open(sys.argv[1] + "/phase.json"))))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env={**env, "TPUCTL_RUN_ID": "r1",
                       "TPUCTL_RESTARTS": "2", "TPUCTL_OUTPUT_DIR": str(tmp_path)}, capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    stopped, doc = r.stdout.split(" ", 1)
    doc = json.loads(doc)
    assert stopped == "True"
    assert doc["restarts"] == 2 and doc["from"] == 7 and list(doc["phases"]) == ["start", "compile", "save"]
    assert [s for s, _ in doc["saves"]] == [7] and doc["step"] == 7
    # run by hand (no TPUCTL_RUN_ID): no phase.json
    (tmp_path / "phase.json").unlink()
    r = subprocess.run([sys.executable, "-c", "from tpuctl import runtime; runtime.phase('start', 0)"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and not list(tmp_path.rglob("phase.json")), r.stderr


# The race the BERT job's drill hit (issue 61): a callback has reported step 11 while the job's own count (its
# saver's, updated by a later callback of the same batch) still says 10, its last checkpoint; SIGTERM lands there.
# The job's "nothing unsaved" says exit at once; the runtime knows step 11 is unsaved and keeps the flag instead.
RACE = """
import json, os, signal, sys
from tpuctl import runtime
runtime.listen_for_stop(lambda: True)   # the job's own count: nothing unsaved (it lags)
p = runtime.Progress(7, path=sys.argv[1] + "/metrics.json")
for step in range(8, 11):
    p.step(step, 0.01)
with p.checkpointing():
    pass
p.step(11, 0.01)                          # reported; not yet seen by the job's count
os.kill(os.getpid(), signal.SIGTERM)
print("flag", runtime.stop_requested(), flush=True)
with p.checkpointing():                   # the job's next read of the flag saves, then exits
    pass
if sys.argv[2] == "at-checkpoint":
    os.kill(os.getpid(), signal.SIGTERM)  # nothing unsaved now: out at once, with the proof
print("not reached", flush=True)
"""


@pytest.mark.parametrize("then", ["flag", "at-checkpoint"])
def test_sigterm_between_a_reported_step_and_the_jobs_own_count_is_a_flag_not_an_exit(tmp_path, then):
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
    r = subprocess.run([sys.executable, "-c", RACE, str(tmp_path), then], capture_output=True, text=True,
                       env={**env, "TPUCTL_RUN_ID": "r1", "TPUCTL_OUTPUT_DIR": str(tmp_path)}, timeout=120,
                       cwd=tmp_path)
    doc = json.loads((tmp_path / "phase.json").read_text())
    assert "flag True" in r.stdout, (r.stdout, r.stderr)
    if then == "flag":
        assert r.returncode == 0 and "not reached" in r.stdout and "stopped" not in doc
    else:
        assert r.returncode == 143 and "not reached" not in r.stdout
        step, checkpoint, _ = doc["stopped"]
        assert step == checkpoint == 11 and [s for s, _ in doc["saves"]] == [10, 11]


BERT = Path(__file__).parent.parent / "jobs" / "bert_pretrain"


@pytest.mark.slow(120)
def test_the_bert_job_passes_its_own_drill(cli, env, tmp_path, monkeypatch):
    """jobs/bert_pretrain (run.py, which prepares the corpus it is given) on JAX (a copy of the job with
    keras_backend = "jax": its restarts load their programs from the warm compile cache), tiny preset at seq 32 and
    batch 4, 20 steps: SIGTERM in the three phases where the job's own code decides, `compile` (it ends at once:
    nothing unsaved, listen_for_stop's exit_when), `step` (its saver saves at the step's end; the race of issue 61:
    a SIGTERM between the metrics callback's step and the saver's exited unsaved) and `save` (the flag read right
    after it); start, eval and a lost host are the drill's own, proven by the fixture jobs above. Each start
    resumed from the checkpoint the store held, nothing redone, and each ended with a checkpoint newer than the
    signal or its proof that the last checkpoint was its step, and its reader began where the uninterrupted run's
    was at that step: the records of the steps before it (batch 4 per host), as the reader itself reported them
    (records.Batches.position) in phase.json. The grace is 120 s, not a spot VM's 30, for a loaded CI machine: a
    job that passes ends long before it."""
    import shutil
    job = tmp_path / "bert"
    shutil.copytree(BERT, job, ignore=shutil.ignore_patterns(".tpuctl-cache", "__pycache__"))
    toml = (job / "tpuctl.toml").read_text()
    (job / "tpuctl.toml").write_text(toml.replace('framework = "keras"', 'framework = "keras"\nkeras_backend = "jax"'))
    sys.path.insert(0, str(BERT))
    import corpus
    corpus.generate(str(tmp_path / "c.txt"), 0.05, seed=1)
    # phase.json as the store held it, the last read of each start (the temporary cluster's store goes with it)
    held: dict[int, dict] = {}
    read = drill.Job.phase

    def phase(self):
        doc = read(self)
        if "restarts" in doc:
            held[int(doc["restarts"])] = doc
        return doc
    monkeypatch.setattr(drill.Job, "phase", phase)
    code, report, err = _drill(cli, job, "--at", "compile,step,save", "--grace", "120", "--",
                               "--corpus", str(tmp_path / "c.txt"), "--vocab-size", "1000", "--seq-length", "32",
                               "--max-predictions-per-seq", "5", "--preset", "tiny", "--batch-size", "4",
                               "--steps", "20", "--log-every", "5", "--checkpoint-every", "5")
    assert code == 0, err
    assert [(d["phase"], d["signal"], d["passed"]) for d in report] == [
        ("compile", "SIGTERM", True), ("step", "SIGTERM", True), ("save", "SIGTERM", True)], json.dumps(report)
    for d in report:
        assert d["ended_in_grace"] and d["redone"] == 0 and d["resumed_from"] == (d["last_checkpoint"] or 0)
        assert d["saved_in_grace"] or d["stopped_at_checkpoint"], json.dumps(d)
    compile_, step, save = report
    # ended at its checkpoint, its proof written (on a loaded machine the first step may end inside the grace and
    # the saver save it first: a save newer than the signal, which passes too)
    assert compile_["stopped_at_checkpoint"]
    assert step["saved_in_grace"] and step["resumed_from"] > 0 and save["saved_in_grace"]
    # the data: each resumed reader began at its checkpoint's records, where the start before had reported being
    assert [d["data"] for d in report] == ["same"] * 3, json.dumps(report)
    assert sorted(held) == [0, 1, 2, 3], sorted(held)
    for r, doc in held.items():
        assert doc["data_from"] == [doc["from"], 4 * doc["from"]], doc   # where this start's reader began
        assert doc.get("data_at", []) == [[s, 4 * s] for s, _ in doc.get("saves", [])], doc   # at each checkpoint
    for r, d in enumerate(report, 1):
        assert held[r]["data_from"] == [d["resumed_from"], 4 * d["resumed_from"]]
        if d["resumed_from"]:   # the checkpoint's step, as the start before saved it with its reader's position
            assert [d["resumed_from"], 4 * d["resumed_from"]] in held[r - 1]["data_at"], held[r - 1]


def test_across_hosts_a_drill_is_a_new_round_every_host_restarts_together(cli, job, local_up, tmp_path, monkeypatch):
    """-c on a run across hosts (test_rounds.py's cluster: four agent processes, two slices of two hosts, one
    store): every host's agent reads the drill's request and signals its own job; the first job's end asks for the
    next round (host/rounds.py), and the run restarts on every host, counted once per drill."""
    from test_rounds import Cluster
    monkeypatch.setenv("TPUCTL_PROGRESS_SECONDS", "0.2")
    monkeypatch.setenv("TPUCTL_RESTART_BACKOFF", "0")
    monkeypatch.setenv("TPUCTL_DRILL_WAIT", "90")
    cluster = Cluster(local_up, tmp_path, monkeypatch)
    try:
        d = job("every", COMPILE=0.5, STEPS=60)
        (d / "tpuctl.toml").write_text('framework = "jax"\n' + (d / "tpuctl.toml").read_text())
        code, report, err = _drill(cli, d, "-c", "rounds", "--at", "step,step:kill", "--grace", "3")
        assert code == 0, err
        assert [(r["phase"], r["signal"], r["passed"]) for r in report] == [
            ("step", "SIGTERM", True), ("step", "SIGKILL", True)], json.dumps(report)
        run_id = err.split("drill: run ")[1].split()[0]
        from tpuctl.core import layout
        rounds = [k for k, _ in cluster.store.list(layout.run_rounds(run_id)) if k.endswith(".json")]
        assert [k[-9:] for k in rounds] == ["0002.json", "0003.json"], rounds   # one round asked for per drill
        cluster.until(lambda: all(s.state.final for s in cluster.statuses(run_id)), 60, "every host to finish")
        sts = cluster.statuses(run_id)
        assert [s.state.value for s in sts] == ["succeeded"] * 4 and {s.restarts for s in sts} == {2}, sts
    finally:
        cluster.stop()
