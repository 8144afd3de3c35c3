"""Issue 36, tpuctl's side: a Keras 3 job (`framework = "keras"`) runs on the backend tpuctl picks from where it runs
(core/backends.py, docs/backends.md), forced by `[env] KERAS_BACKEND` or `keras_backend`; what the host installs
for it; and tpuctl itself on a machine with Keras and JAX and no TensorFlow."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from jobs import make_job
from tpuctl.core import backends, jobspec
from tpuctl.core.errors import TpuctlError
from tpuctl.core.runs import RunSpec
from tpuctl.host import kerasbackend

ROOT = Path(__file__).resolve().parent.parent
KERAS_JOB = Path(__file__).parent / "keras_job"
BERT = ROOT / "jobs" / "bert_pretrain"
# Until the i36-job branch lands, jobs/bert_pretrain is tf-keras (Keras 2) on TensorFlow: the tests that run it on
# Keras 3's JAX backend wait for it (and run on their own once its requirements no longer name tf-keras).
BERT_IS_KERAS_2 = "tf-keras" in (BERT / "requirements.txt").read_text()
needs_keras3_bert = pytest.mark.skipif(BERT_IS_KERAS_2, reason="needs i36-job's Keras 3 jobs/bert_pretrain")

TF_VM = {"arch": "vm", "hosts": 1, "framework": "tensorflow", "runtime": "tpu-vm-tf-2.18.0-pjrt",
         "tensorflow_from": "image"}
BASE_VM = {"arch": "vm", "hosts": 1, "framework": "jax", "runtime": "v2-alpha-tpuv5-lite"}


@pytest.mark.parametrize("record, accelerator, tf_imports, want", [
    (TF_VM, "v4-8", False, "tensorflow"),                                    # a TensorFlow runtime
    ({"arch": "node", "runtime": "2.12.0"}, "v3-8", False, "tensorflow"),     # beside a legacy Node
    ({**TF_VM, "runtime": "tpu-vm-tf-2.16.1-pjrt"}, "v3-8", False, "tensorflow"),   # Keras 3's oldest TensorFlow
    ({**TF_VM, "runtime": "tpu-vm-tf-2.15.0-pjrt"}, "v3-8", False, "jax"),   # older: keras#19448's failure
    (BASE_VM, "v5litepod-8", True, "jax"),                                   # a base runtime
    ({**TF_VM, "runtime": "v2-alpha-tpuv5", "tensorflow_from": "pip"}, "v5p-8", False, "jax"),   # TF cluster, base
    ({**BASE_VM, "slices": 2, "hosts": 2}, "v5litepod-16", False, "jax"),    # Multislice
    ({**TF_VM, "slices": 2}, "v4-8", False, "jax"),
    ({"arch": "vm"}, "gpu:2", True, "jax"),                                  # GPUs
    ({"arch": "vm"}, "cpu", True, "tensorflow"),                             # this machine, TensorFlow importable
    ({"arch": "vm"}, "cpu", False, "jax"),                                   # ... and without it
])
def test_the_backend_follows_the_target(record, accelerator, tf_imports, want):
    name, why = backends.for_host(record, accelerator, tf_imports)
    assert name == want and why


def test_a_runtime_whose_tensorflow_predates_keras_3_says_so():
    assert "TensorFlow 2.15.0 predates Keras 3" in backends.for_host(
        {**TF_VM, "runtime": "tpu-vm-tf-2.15.0-pjrt"}, "v3-8", False)[1]
    assert backends.too_old_for_keras_3({"arch": "node", "runtime": "2.12.0"}) == "2.12.0"
    assert backends.too_old_for_keras_3({"arch": "vm", "runtime": "1.34.0-gke.2201000"}) == ""   # not TensorFlow's
    old_vm = {"arch": "vm", "runtime": "tpu-vm-tf-2.15.0-pjrt"}
    assert "forces Keras's TensorFlow backend" in backends.old_tensorflow_refusal(old_vm, "tensorflow")[0]
    assert backends.old_tensorflow_refusal(old_vm, "") is None                 # tpuctl picks JAX there
    assert backends.old_tensorflow_refusal({**old_vm, "runtime": "tpu-vm-tf-2.18.0-pjrt"}, "tensorflow") is None


@pytest.mark.parametrize("platform, accelerator, want", [
    ("kaggle", "kaggle:TpuV5E8", "jax"), ("kaggle", "gpu:2", "jax"), ("kaggle", "cpu", "jax"),
    ("notebook", "v5litepod-1", "jax"), ("notebook", "notebook", "tensorflow")])
def test_kaggle_and_colab_run_keras_on_jax(platform, accelerator, want):
    assert backends.for_session(platform, accelerator, True)[0] == want


def _spec(**kw):
    return RunSpec(id="r", name="job", command="python train.py", package="0", **{"framework": "keras", **kw})


def test_a_job_or_user_forces_it_and_the_slice_rules_follow_the_backend():
    assert kerasbackend.pick(_spec(keras_backend="tensorflow"), BASE_VM, "v5litepod-8") == \
        ("tensorflow", "forced by keras_backend in tpuctl.toml")
    assert kerasbackend.pick(_spec(env={"KERAS_BACKEND": "jax"}), TF_VM, "v4-8") == \
        ("jax", "forced by [env] KERAS_BACKEND")
    # TensorFlow runs one program, on worker 0; JAX one per host
    assert kerasbackend.framework(_spec(), TF_VM, "v4-32") == "tensorflow"
    assert kerasbackend.framework(_spec(), BASE_VM, "v5litepod-16") == "jax"
    assert kerasbackend.framework(_spec(framework="tensorflow"), BASE_VM, "v5litepod-16") == "tensorflow"
    assert kerasbackend.environment(_spec(), BASE_VM, "v5litepod-8") == {"KERAS_BACKEND": "jax"}
    assert kerasbackend.environment(_spec(env={"KERAS_BACKEND": "torch"}), BASE_VM, "v5litepod-8") == {}


@pytest.mark.parametrize("toml, words", [
    ('framework = "keras"\nkeras_backend = "torch"\n', "'keras_backend' 'torch' is not a backend"),
    ('framework = "keras"\nkeras_backend = "JAX"\n', "'keras_backend' 'JAX' is not spelled as Keras reads it"),
    ('keras_backend = "jax"\n', "'keras_backend' is for Keras 3 jobs, not tensorflow ones"),
    ('framework = "keras"\nkeras_backend = "jax"\n[env]\nKERAS_BACKEND = "tensorflow"\n', "disagree"),
    ('framework = "keras"\nkeras_backend = 3\n', "'keras_backend' must be a str"),
])
def test_a_keras_backend_key_that_cannot_be_is_refused(tmp_path, toml, words):
    job = make_job(tmp_path, "print(1)\n", toml)
    with pytest.raises(TpuctlError) as e:
        jobspec.load(str(job))
    assert e.value.exit_code == 2 and words in e.value.message, e.value.message


@pytest.mark.parametrize("value, words", [
    ("", "is empty: Keras ignores it and falls back to TensorFlow"),
    ("JAX", "is not spelled as Keras reads it (it takes 'jax' exactly)"),
    ("TensorFlow", "is not spelled as Keras reads it (it takes 'tensorflow' exactly)"),
    (" jax", "is not spelled as Keras reads it (it takes 'jax' exactly)"),
    ("torch", "is not a backend tpuctl runs (jax or tensorflow)"),
])
def test_an_env_keras_backend_keras_would_not_run_is_refused_at_submit(tmp_path, value, words):
    """Issue 52.7: these passed `submit` and failed on the host ("" ran on TensorFlow while the log said jax)."""
    job = make_job(tmp_path, "print(1)\n", f'framework = "keras"\n[env]\nKERAS_BACKEND = "{value}"\n')
    with pytest.raises(TpuctlError) as e:
        jobspec.load(str(job))
    assert e.value.exit_code == 2 and f"[env] KERAS_BACKEND {value!r} {words}" in e.value.message, e.value.message
    assert e.value.hint


def test_a_job_written_with_an_empty_keras_backend_is_logged_as_what_keras_uses():
    """One written before submit refused it: the log's first line names TensorFlow, which Keras falls back to."""
    job = _spec(env={"KERAS_BACKEND": ""})
    assert kerasbackend.pick(job, BASE_VM, "v5litepod-8")[0] == "tensorflow"
    assert kerasbackend.environment(job, BASE_VM, "v5litepod-8") == {}   # the job's own "" stays: Keras reads it
    assert "keras backend tensorflow (forced by an empty [env] KERAS_BACKEND" in \
        kerasbackend.said(job, BASE_VM, "v5litepod-8")


def test_a_keras_job_may_name_its_tensorflow(tmp_path):
    spec = jobspec.load(str(make_job(tmp_path, "print(1)\n", 'framework = "keras"\nkeras_backend = "tensorflow"\n'
                                                               'tensorflow = "2.19"\n')))
    assert (spec.framework.value, spec.keras_backend, spec.tensorflow) == ("keras", "tensorflow", "2.19")


def test_a_keras_job_on_this_machine_with_tensorflow_runs_on_tensorflow(local_up, cli):
    local_up("kt")
    code, out, err = cli("submit", str(KERAS_JOB), "-c", "kt")
    assert code == 0, out + err
    assert "tpuctl: keras backend tensorflow (TensorFlow is installed on this machine)" in out, out
    assert "backend tensorflow KERAS_BACKEND tensorflow" in out and "loss fell" in out, out


# -- tpuctl on a machine with Keras and JAX and no TensorFlow ----------------------------------------------------------

def _tpuctl(python, *args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([str(python), "-m", "tpuctl", *args], capture_output=True, text=True, timeout=timeout, env=env,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture
def jax_machine(env, jax_python):
    """`tpuctl up --provider local` run by the interpreter without TensorFlow (its agent is that interpreter too)."""
    assert subprocess.run([str(jax_python), "-c", "import tensorflow"], capture_output=True).returncode != 0
    code, out, err = _tpuctl(jax_python, "up", "--provider", "local", "-c", "kj")
    assert code == 0, err
    yield jax_python
    _tpuctl(jax_python, "down", "-c", "kj", "--yes")


def test_without_tensorflow_a_keras_job_runs_on_jax(jax_machine):
    code, out, err = _tpuctl(jax_machine, "submit", str(KERAS_JOB), "-c", "kj")
    assert code == 0, out + err
    assert "tpuctl: keras backend jax (no TensorFlow on this machine)" in out.splitlines()[0], out
    assert "backend jax KERAS_BACKEND jax" in out and "loss fell" in out, out


@needs_keras3_bert
@pytest.mark.slow(60)
def test_without_tensorflow_the_bert_job_trains_on_jax(jax_machine):
    """The job as submitted (run.py: a generated corpus, its preparation, train.py), small: a 0.3 MB corpus, a 2,000
    word vocabulary, sequences of 64, 10 steps of 8 (run.py's defaults, 2 MB, 30,000 words and 128, took 39
    CPU-seconds for the same proof; 20 steps, 1.4 CPU-s more: the loss falls 0.5 in 10 at this learning rate, and
    rose over 4)."""
    code, out, err = _tpuctl(jax_machine, "submit", str(BERT), "-c", "kj", "--", "--preset", "tiny", "--sample-mb",
                             "0.3", "--vocab-size", "2000", "--seq-length", "64", "--max-predictions-per-seq", "10",
                             "--batch-size", "8", "--steps", "10", "--log-every", "5", "--learning-rate", "1e-2",
                             timeout=580)
    assert code == 0, out + err
    assert "tpuctl: keras backend jax" in out
    losses = [float(ln.split()[3]) for ln in out.splitlines() if ln.startswith("step ")]
    print("losses", losses)
    assert len(losses) == 2 and losses[-1] < losses[0], out


def test_the_bert_jobs_toml_is_a_keras_job_once_ported():
    """The contract with i36-job: its tpuctl.toml says framework = "keras" and its requirements name Keras 3."""
    spec = jobspec.load(str(BERT))
    if BERT_IS_KERAS_2:
        pytest.skip("needs i36-job's Keras 3 jobs/bert_pretrain")
    assert spec.framework.value == "keras" and spec.keras_backend == "", json.dumps(spec.env)


# -- a TPU VM on a base runtime: JAX installed for the job, as JAX installs on TPUs ------------------------------------

PRINT_JAX = """import importlib.util as u, os, jax, libtpu
print("KERAS_BACKEND", os.environ.get("KERAS_BACKEND"), "jax", jax.__version__, "libtpu", libtpu.__version__)
print("tensorflow importable", u.find_spec("tensorflow") is not None)
"""


def test_on_a_base_runtime_a_keras_job_gets_jax_tpu_installed_once(tmp_path, wheel_index):
    from test_tensorflow_install import _run
    base = {"framework": "jax", "tensorflow_from": ""}
    job = make_job(tmp_path / "job", PRINT_JAX, 'framework = "keras"\n')
    st, log, _ = _run(tmp_path, wheel_index, "", extra_record=base, runtime="v2-alpha-tpuv5-lite", job=job)
    assert st.state.value == "succeeded", log
    assert log.startswith("tpuctl: keras backend jax (a TPU VM on the base runtime v2-alpha-tpuv5-lite"), log
    assert "installing jax[tpu]" in log and "installing tensorflow" not in log, log
    assert "KERAS_BACKEND jax jax 0.10.2 libtpu 0.0.42.1" in log and "tensorflow importable False" in log, log
    (tmp_path / "store").rename(tmp_path / "store-1")   # a new store, the same host: the environment is kept
    st, log, _ = _run(tmp_path, wheel_index, "", extra_record=base, runtime="v2-alpha-tpuv5-lite", job=job)
    assert st.state.value == "succeeded" and "JAX already installed" in log, log


def test_a_keras_job_that_forces_tensorflow_on_a_base_runtime_gets_tensorflow_tpu(tmp_path, wheel_index):
    from test_tensorflow_install import _run
    job = make_job(tmp_path / "job", "import os, tensorflow as tf\nprint('KERAS_BACKEND', os.environ['KERAS_BACKEND'],"
                   " tf.__version__, tf.__distribution__)\n", 'framework = "keras"\nkeras_backend = "tensorflow"\n')
    st, log, _ = _run(tmp_path, wheel_index, "", job=job)
    assert st.state.value == "succeeded", log
    assert "tpuctl: keras backend tensorflow (forced by keras_backend in tpuctl.toml)" in log
    assert "installing tensorflow-tpu~=2.20.0" in log and "KERAS_BACKEND tensorflow 2.20.0 tensorflow-tpu" in log, log
    assert "tpuctl: TensorFlow's TPU library: " in log and "installing jax" not in log, log


def test_keras_is_a_jobs_framework_never_a_clusters(cloud, cli):
    """`up --framework` picks a runtime image; a Keras 3 job runs on either (its backend follows the runtime)."""
    code, out, err = cli("up", "--type", "v4-8", "--zone", "us-central1-b", "-c", "k", "--framework", "keras")
    assert code == 2 and "unknown --framework 'keras'" in err and "its backend follows the runtime" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("job_env, key, want", [({}, "", "jax"), ({}, "tensorflow", "tensorflow"),
                                                ({"KERAS_BACKEND": "torch"}, "", "torch")])
def test_a_sessions_backend_is_tpuctls_pick_over_the_images_unless_the_job_forces_one(tmp_path, monkeypatch, job_env,
                                                                                      key, want):
    from tpuctl.host import session
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")   # whatever the image's environment says
    cfg = {"env": job_env, "keras_backend": key, "framework": "keras", "platform": "kaggle",
           "accelerator": "kaggle:TpuV5E8", "run_id": "r", "session": 1, "tensorflow": ""}
    dirs = {k: tmp_path / k for k in ("wheel", "out", "data", "store")}
    assert session.environment(cfg, dirs, 0.0)["KERAS_BACKEND"] == want
    assert session.keras_backend(cfg)[0] == want


@pytest.mark.tpu_nodes
def test_a_keras_3_job_beside_a_node_older_than_keras_3_is_refused_before_any_upload(cloud, cli, tmp_path):
    """A Node runs TensorFlow only (no JAX), and the fake's, as Google's, is older than Keras 3's 2.16.1."""
    assert cli("up", "--type", "v2-8", "--zone", "us-central1-b", "-c", "nd", "--arch", "node")[0] == 0
    job = make_job(tmp_path, "print(1)\n", 'framework = "keras"\n')
    cloud.gcs.calls.clear()
    code, out, err = cli("submit", str(job), "-c", "nd")
    assert code == 2 and "needs TensorFlow 2.16.1 or later" in err and "TensorFlow 2.12.0" in err, err
    assert "Traceback" not in err and not [c for c in cloud.gcs.calls if c.startswith(("POST", "PUT"))]
