"""--provider kaggle against the wire-level fake Kaggle (tests/fakes/kaggle.py), through the real kagglesdk client:
credentials, quota, a run chained across sessions cut at their time limit, logs, jobs, download, re-submits that
upload nothing, cancel, and `down` leaving nothing of tpuctl's on Kaggle."""
import json
import os
import stat
from pathlib import Path

import pytest

from jobs import make_job

KEY = "k" * 32
JOB = Path(__file__).parent.parent / "jobs" / "bert_pretrain"

# Counts to 16, a quarter second a step, keeping its progress in TPUCTL_OUTPUT_DIR as a checkpoint would.
COUNTER = """
import os, time
ck = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "step")
start = int(open(ck).read()) if os.path.exists(ck) else 0
print("resuming at", start, "on", os.environ["TPUCTL_ACCELERATOR"], flush=True)
for step in range(start + 1, 17):
    time.sleep(0.25)
    open(ck, "w").write(str(step))
    print("step", step, flush=True)
print("done", flush=True)
"""


@pytest.fixture(scope="session")
def _fake_kaggle(tmp_path_factory):
    from fakes.kaggle import FakeKaggle
    fake = FakeKaggle(tmp_path_factory.mktemp("kaggle"))
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def kaggle(_fake_kaggle, env, monkeypatch, tmp_path, wheel_index):
    _fake_kaggle.reset()
    _fake_kaggle.session_env = {"TPUCTL_TF_FIND_LINKS": wheel_index.url, "PIP_FIND_LINKS": wheel_index.url,
                                "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    monkeypatch.setenv("KAGGLE_API_ENVIRONMENT", "TEST")
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(tmp_path / "kaggle-config"))
    monkeypatch.setenv("KAGGLE_USERNAME", "alice")
    monkeypatch.setenv("KAGGLE_KEY", KEY)
    monkeypatch.setenv("TPUCTL_KAGGLE_POLL", "0.05")
    monkeypatch.setenv("TPUCTL_LOG_POLL_MAX", "0.1")
    monkeypatch.setenv("TPUCTL_KAGGLE_GRACE_SECONDS", "0.2")
    yield _fake_kaggle
    assert _fake_kaggle.errors == []


def _up(cli, *flags):
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg", *flags)
    assert code == 0, err
    return err


def test_a_run_longer_than_a_session_chains_through_sessions_and_down_leaves_nothing(kaggle, cli, tmp_path,
                                                                                      monkeypatch):
    err = _up(cli, "--type", "v5e-8")
    assert "TpuV5E8" in err and "free" in err
    status = json.loads(cli("status", "-c", "kg", "--json")[1])
    assert status["tpu_quota"].startswith("0s of 20h used this week") and status["machine_shape"] == "TpuV5E8"
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "1.2")   # the script stops the job, the next session goes on
    job = make_job(tmp_path, COUNTER)
    code, out, err = cli("submit", str(job), "-c", "kg", "--chain", "30")
    assert code == 0, out + err
    assert out.count("resuming at") >= 3 and "resuming at 0 on kaggle:TpuV5E8" in out
    assert out.count("step 16\n") == 1 and "done" in out.splitlines()[-1]
    assert "the next session resumes it" in out
    sessions = out.count("--- Kaggle session ")
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "succeeded" and row["attempt"] == sessions >= 3
    assert len(row["sessions"]) == sessions and all(s["state"] == "COMPLETE" and s["hours"] > 0
                                                    for s in row["sessions"])
    # what was pushed: the TPU's machine shape, private, no pinned image, the dataset (and the previous session)
    pushed = [json.loads(k["request"]) if isinstance(k["request"], str) else k["request"]
              for k in kaggle.kernels.values()]
    assert all(p["machineShape"] == "TpuV5E8" and p["isPrivate"] and "dockerImage" not in p for p in pushed)
    assert sorted(len(p.get("kernelDataSources", [])) for p in pushed) == [0] + [1] * (sessions - 1)
    assert len(kaggle.datasets) == 1 and all(d["private"] for d in kaggle.datasets.values())
    dest = tmp_path / "got"
    assert cli("download", "-c", "kg", "-o", str(dest))[0] == 0
    assert (dest / "step").read_text() == "16"
    # the same job again: its dataset is there already, nothing is uploaded
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "60")
    uploads = sum(1 for c in kaggle.calls if c.startswith("PUT /upload/"))
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 0 and "unchanged: nothing uploaded" in err, err
    assert sum(1 for c in kaggle.calls if c.startswith("PUT /upload/")) == uploads and len(kaggle.datasets) == 1
    code, out, err = cli("down", "-c", "kg", "--yes")
    assert code == 0, err
    assert kaggle.leftovers() == []


def test_a_detached_chain_is_moved_on_by_tpuctl_watch(kaggle, cli, tmp_path, monkeypatch):
    _up(cli, "--type", "v5e-8")
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "1.2")
    code, out, err = cli("submit", str(make_job(tmp_path, COUNTER)), "-c", "kg", "--detach", "--chain", "30")
    assert code == 0, err
    code, _, err = cli("watch", "-c", "kg")          # nobody follows it: the watch pushes each next session
    assert code == 0 and "no unfinished run" in err, err
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "succeeded" and row["attempt"] >= 3
    assert "step 16" in cli("logs", "-c", "kg")[1]
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


def test_a_session_kaggle_stops_at_its_hard_limit_is_continued(kaggle, cli, tmp_path, monkeypatch):
    """The job ignores the deadline and the script's own stop comes too late: Kaggle ends the session (ERROR, time
    limit); its output so far is attached to the next session, which resumes from the checkpoint."""
    _up(cli, "--type", "t4x2")   # no TensorFlow to install: the whole limit is the job's
    kaggle.session_limit = 1.5
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "60")
    code, out, err = cli("submit", str(make_job(tmp_path, COUNTER)), "-c", "kg", "--chain", "30")
    assert code == 0, out + err
    assert "exceeded the session time limit" in out and "resuming at 0" in out and "step 16\n" in out
    assert out.count("resuming at") >= 2
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


def test_a_job_that_fails_fails_the_run_with_its_code(kaggle, cli, tmp_path):
    _up(cli, "--type", "cpu")
    code, out, err = cli("submit", str(make_job(tmp_path, "print('about to fail')\nraise SystemExit(3)\n")), "-c", "kg")
    assert code == 3, out + err
    assert "about to fail" in out and "ERROR" in out
    assert [k["request"].get("machineShape") for k in kaggle.kernels.values()] == [None]
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


def test_cancel_stops_the_session(kaggle, cli, tmp_path):
    _up(cli, "--type", "t4x2")
    job = make_job(tmp_path, "import time\nprint('long', flush=True)\ntime.sleep(60)\n")
    code, out, err = cli("submit", str(job), "-c", "kg", "--detach")
    assert code == 0, err
    run_id = out.strip()
    assert cli("cancel", run_id, "-c", "kg")[0] == 0
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "cancelled" and kaggle.kernels == {}
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


def test_credentials_and_refusals_are_one_line_each_and_leave_nothing(kaggle, cli, tmp_path, monkeypatch):
    monkeypatch.delenv("KAGGLE_USERNAME")
    monkeypatch.delenv("KAGGLE_KEY")
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg")
    assert code == 5 and "no Kaggle credentials" in err and "kaggle.json" in err and "Traceback" not in err
    cfg = Path(os.environ["KAGGLE_CONFIG_DIR"])
    cfg.mkdir()
    (cfg / "kaggle.json").write_text(json.dumps({"username": "alice", "key": KEY}))
    (cfg / "kaggle.json").chmod(0o644)
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg")
    assert code == 5 and "readable by other users" in err and "chmod 600" in err
    (cfg / "kaggle.json").chmod(stat.S_IRUSR | stat.S_IWUSR)
    (cfg / "kaggle.json").write_text(json.dumps({"username": "alice", "key": "wrong"}))
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg")
    assert code == 5 and "refused the API key" in err and "wrong" not in err
    (cfg / "kaggle.json").write_text(json.dumps({"username": "alice", "key": KEY}))
    kaggle.tpu_used = kaggle.tpu_allowed
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg", "--type", "v5e-8")
    assert code == 4 and "weekly TPU quota" in err
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg", "--type", "p100")
    assert code == 2 and "retired" in err and "t4x2" in err
    kaggle.tpu_used = 0.0
    _up(cli, "--type", "v5e-8")
    kaggle.phone_verified = False
    code, out, err = cli("submit", str(make_job(tmp_path, "print(1)\n")), "-c", "kg")
    assert code == 6 and "Phone verification" in err and "verify your phone" in err
    assert kaggle.kernels == {}
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])   # the run that Kaggle refused: failed, and why
    assert row["state"] == "failed"
    assert "Phone verification" in cli("logs", row["id"], "-c", "kg")[1]
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


def _final(out):
    """(step, loss) of the last `step N loss L` line."""
    last = [line.split() for line in out.splitlines() if line.startswith("step ") and " loss " in line][-1]
    return int(last[1]), float(last[3])


def test_bert_cut_by_the_session_limit_ends_as_the_uninterrupted_run(kaggle, cli, monkeypatch, tmp_path):
    """The flagship job on Kaggle: sessions cut at their limit (the job saves and exits 85 when
    tpuctl.runtime.session_ending() says so, at a log line), chained into one run, end at the step and loss of an
    uninterrupted run on the same prepared data (prepared once, in the run's store, kept across its sessions: the
    tokenizer's training is not reproducible to the bit, so a second preparation would differ)."""
    import subprocess
    import sys
    _up(cli, "--type", "t4x2")   # Kaggle's GPU image has its TensorFlow (here this environment's, on the CPU)
    steps = ["--preset", "tiny", "--steps", "300", "--deterministic", "--log-every", "20", "--checkpoint-every", "100"]
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "40")   # past the job's environment and TensorFlow start-up
    monkeypatch.setenv("TPUCTL_KAGGLE_GRACE_SECONDS", "60")
    code, cut, err = cli("submit", str(JOB), "-c", "kg", "--chain", "16", "--", *steps)
    assert code == 0, cut[-3000:] + err[-2000:]
    sessions = cut.count("--- Kaggle session ")
    assert sessions >= 2 and "bert: the session ends: checkpoint at step" in cut and "bert: resumed from step" in cut
    assert cut.count("generated 2.0 MB") == 1 or "prepared" in cut   # prepared once for all sessions
    [k] = [k for slug, k in kaggle.kernels.items() if slug.endswith(f"-s{sessions}")]
    prepared = k["versions"][-1]["dir"] / "kaggle" / "working" / "store" / "prepared" / "bert_pretrain-128"
    vocab = json.loads((prepared / "prepared.json").read_text())["vocab_size"]
    whole = subprocess.run([sys.executable, str(JOB / "train.py"), "--data", f"{prepared}/part-*.tfrecord",
                            "--vocab-size", str(vocab), "--seq-length", "128", "--max-predictions-per-seq", "20",
                            "--output", str(tmp_path / "whole"), *steps], capture_output=True, text=True,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1"), timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert _final(cut) == _final(whole.stdout) and _final(cut)[0] == 300
    assert cli("download", "-c", "kg", "-o", str(tmp_path / "got"))[0] == 0
    assert list((tmp_path / "got" / "checkpoints").glob("ckpt-300.index"))
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


# -- inside the session (issue 29 items 2, 3, 8; issue 28 item 7) ------------------------------------------------------

MARKERS = "@OUTPUT@ @EXIT@ @CONTINUE@ @CONTINUE_MARK@ @STORE@"


def test_template_markers_in_a_jobs_command_args_and_env_reach_it_as_written(kaggle, cli, tmp_path):
    _up(cli, "--type", "cpu")
    job = make_job(tmp_path, "import os, sys\nprint('env', os.environ['MARKS'], 'args', *sys.argv[1:])\n",
                   f'[env]\nMARKS = "{MARKERS}"\n')
    (job / "tpuctl.toml").write_text((job / "tpuctl.toml").read_text().replace(
        'command = "python main.py"', f'command = "echo cmd {MARKERS} && python main.py"'))
    code, out, err = cli("submit", str(job), "-c", "kg", "--", *MARKERS.split())
    assert code == 0, out + err
    assert f"cmd {MARKERS}\n" in out and f"env {MARKERS} args {MARKERS}\n" in out, out


TWO_SESSIONS = """
import os, sys
print("data:", open(os.path.join(os.environ["TPUCTL_DATA_DIR"], "d", "greeting.txt")).read().strip(), flush=True)
ck = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "ck.tar.gz")   # an archive in the output: copied back as it is
if os.environ["TPUCTL_SESSION"] == "1":
    open(ck, "wb").write(b"\\x1f\\x8b checkpoint")
    sys.exit(85)                                  # checkpoint written: go on in the next session
print("resumed from", open(ck, "rb").read()[2:].decode().strip(), flush=True)
"""


@pytest.mark.parametrize("layout", ["datasets", "flat"])
@pytest.mark.parametrize("unpack", [True, False], ids=["archives-unpacked", "archives-kept"])
def test_the_session_finds_its_inputs_wherever_kaggle_mounts_them(kaggle, cli, tmp_path, layout, unpack):
    """Both mount layouts (datasets/<owner>/<slug> and the older <slug>), archives unpacked or kept: the inputs and
    the previous session's output are found by their markers and checked against the manifest."""
    _up(cli, "--type", "cpu")
    kaggle.mount_layout, kaggle.unpack_archives = layout, unpack
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "greeting.txt").write_text("hello\n")
    code, out, err = cli("submit", str(make_job(tmp_path, TWO_SESSIONS)), "-c", "kg", "--data", str(tmp_path / "d"),
                         "--chain", "3")
    assert code == 0, out + err
    assert out.count("data: hello") == 2 and "resumed from checkpoint" in out
    assert out.count("sizes and sha256 as uploaded") == 2
    mounted = [p for k in kaggle.kernels.values() for s in k["versions"] for p in s["dir"].rglob("tpuctl-inputs-*")]
    assert len(mounted) == 2 and all(("/input/datasets/alice/" in str(p)) == (layout == "datasets") for p in mounted)
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


def test_inputs_that_are_not_there_or_not_as_uploaded_are_named(kaggle, cli, tmp_path):
    _up(cli, "--type", "cpu")
    job = make_job(tmp_path, "print('the job ran')\n")
    assert cli("submit", str(job), "-c", "kg")[0] == 0
    [ds] = kaggle.datasets.values()
    ds["files"]["data.tar.bin"] += b"damaged"          # the same job again attaches the same dataset, now damaged
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 127 and "the job ran" not in out, out
    assert "are not what was uploaded: data.tar.bin has" in out, out
    ds["files"]["data.tar.bin"] = ds["files"]["job.tar.gz.bin"][len(b"tpuctl payload 1\n"):]   # a real archive
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 127 and "data.tar.bin arrived as a folder (Kaggle unpacked it)" in out, out
    del ds["files"]["data.tar.bin"]
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 127 and "data.tar.bin is missing" in out, out
    [manifest] = [n for n in ds["files"] if n.startswith("tpuctl-inputs-")]
    del ds["files"][manifest]
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 127 and f"cannot find the run's inputs (marker {manifest})" in out, out
    assert "there: datasets/alice/tpuctl-" in out, out
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


PRINT_TF = """import importlib.metadata as m, tensorflow as tf
print("version", tf.__version__, "from", tf.__distribution__)
print("distributions", sorted(set(m.packages_distributions().get("tensorflow", []))))
print("keras", tf.keras.__name__, tf.keras.__version__)
print("tpu cores", len(tf.config.list_logical_devices("TPU")))
"""
NOISE = ("E0000 00:00:1732000000.123456    4242 cuda_executor.cc:1228] failed call to cuInit: INTERNAL: CUDA error: "
         "Failed call to cuInit: UNKNOWN ERROR (303)")


def test_a_tensorflow_job_on_the_tpu_gets_a_tensorflow_that_drives_it(kaggle, cli, tmp_path):
    """Kaggle's TPU image has tensorflow-cpu only: the session installs tensorflow-tpu at the job's version with
    tf-keras, keeps the job's requirements from replacing it, and checks the TPU before the job starts."""
    _up(cli, "--type", "v5e-8")
    job = make_job(tmp_path, f"print({NOISE!r}, flush=True)\n" + PRINT_TF,
                   'tensorflow = "2.19"\nrequirements = "requirements.txt"\n')
    (job / "requirements.txt").write_text("tf-keras\n")   # as the BERT job's: would pull PyPI's tensorflow
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 0, out + err
    assert "version 2.19.1 from tensorflow-tpu" in out, out
    # no PyPI tensorflow in the job's environment; the image's tensorflow-cpu is there, behind tensorflow-tpu
    assert "distributions ['tensorflow-cpu', 'tensorflow-tpu']" in out, out
    assert "keras tf_keras 2.19.0" in out and "tpu cores 8" in out
    assert "TensorFlow 2.19.1 sees 8 TPU core(s)" in out
    assert "cuInit" not in out                             # TensorFlow's start-up noise, filtered as the agent does
    # a TensorFlow that cannot drive the TPU (here: no PJRT library path): one line, and the job never starts
    (job / "tpuctl.toml").write_text((job / "tpuctl.toml").read_text() + '[env]\nTF_PLUGGABLE_DEVICE_LIBRARY_PATH = ""\n')
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 127 and "version 2.19.1" not in out, out
    assert "TensorFlow 2.19.1 from " in out and "sees no TPU, only CPU; RuntimeError: No TPU platform found" in out
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


def test_a_jax_job_uses_the_images_own_stack(kaggle, cli, tmp_path):
    _up(cli, "--type", "v5e-8")
    job = make_job(tmp_path, "import importlib.util as u\nprint('tf-keras', u.find_spec('tf_keras') is not None)\n",
                   'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 0 and "tf-keras False" in out and "installing tensorflow" not in out, out
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


def test_the_session_script_and_the_uploader_agree_on_the_payload_mark():
    from tpuctl.host import session
    from tpuctl.providers.kaggle import kernel
    assert kernel.MAGIC == session.MAGIC


def test_a_chain_keeps_the_script_that_matches_its_datasets_wheel(kaggle, cli, tmp_path, monkeypatch):
    """tpuctl upgraded while a chain runs: the next session still runs the script of the tpuctl whose wheel is in
    the run's dataset (a newer script beside an older wheel would call what that wheel does not have)."""
    _up(cli, "--type", "cpu")
    code, out, err = cli("submit", str(make_job(tmp_path, TWO_SESSIONS)), "-c", "kg", "--detach", "--chain", "3",
                         "--data", str(_greeting(tmp_path)))
    assert code == 0, err
    from tpuctl.providers.kaggle import kernel
    monkeypatch.setattr(kernel, "source", lambda: "raise SystemExit('a newer tpuctl, another wheel')\n")
    assert cli("watch", "-c", "kg")[0] == 0
    log = cli("logs", "-c", "kg")[1]
    assert "resumed from checkpoint" in log and "a newer tpuctl" not in log, log
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []


def _greeting(tmp_path):
    (tmp_path / "d").mkdir(exist_ok=True)
    (tmp_path / "d" / "greeting.txt").write_text("hello\n")
    return tmp_path / "d"


def test_a_previous_session_whose_output_is_not_attached_is_named(kaggle, cli, tmp_path):
    import time
    _up(cli, "--type", "cpu")
    code, out, err = cli("submit", str(make_job(tmp_path, TWO_SESSIONS)), "-c", "kg", "--detach", "--chain", "3",
                         "--data", str(_greeting(tmp_path)))
    assert code == 0, err
    [first] = [k["versions"][-1] for k in kaggle.kernels.values()]
    deadline = time.monotonic() + 60
    while first["status"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    [marker] = (first["dir"] / "kaggle" / "working").glob("tpuctl-*-s1.json")
    marker.unlink()                                      # its output, as the next session gets it, lacks the marker
    assert cli("watch", "-c", "kg")[0] == 0
    log = cli("logs", "-c", "kg")[1]
    assert f"cannot find the previous session's output (marker {marker.name})" in log, log
    assert "resumed from" not in log
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "failed" and row["exit_code"] == 127
    assert cli("down", "-c", "kg", "--yes")[0] == 0 and kaggle.leftovers() == []
