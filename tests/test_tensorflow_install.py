"""TensorFlow on a TPU VM made on a base runtime, installed the way Google's own TF release tests do it (issue 19):
tensorflow-tpu at the version the job's tpuctl.toml asks for, tf-keras with --no-deps, from a real pip against a
local HTTP index (fakes/pyindex.py). The agent runs on an interpreter with no TensorFlow of its own, as on a base
runtime, from a clean environment (no PYTHONPATH), the way systemd starts it."""
import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pip
import pytest

from jobs import make_job, submit_to_store
from tpuctl.core import jobspec, layout, runs
from tpuctl.core.errors import TpuctlError
from tpuctl.core.store import LocalStore

ROOT = Path(__file__).resolve().parent.parent
PRINT_TF = """import importlib.metadata as m, os, tensorflow as tf
print("version", tf.__version__, "from", tf.__distribution__)
print("distributions", sorted(set(m.packages_distributions().get("tensorflow", []))))
print("keras", tf.keras.__name__, tf.keras.__version__)
print("libtpu", os.environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "").endswith("site-packages/libtpu/libtpu.so"))
"""


def _bare_host(tmp_path, libtpu: str = "") -> Path:
    """A base runtime's interpreter: a venv with no site-packages of ours but tpuctl (a .pth to the checkout) and pip
    (the image's pip), so no TensorFlow, tf-keras, keras or JAX is importable; `libtpu`: that libtpu installed in it
    (an image that ships one outside the job's environment, as Kaggle's does)."""
    venv = tmp_path / ("host-venv" + (f"-libtpu-{libtpu}" if libtpu else ""))
    if (venv / "bin" / "python").exists():
        return venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "tpuctl-checkout.pth").write_text(str(ROOT) + "\n")
    shutil.copytree(Path(pip.__file__).parent, site / "pip")
    if libtpu:
        from fakes import pyindex
        zipfile.ZipFile(pyindex.libtpu_wheel(tmp_path / "host-wheels", libtpu)).extractall(site)
    return venv / "bin" / "python"


def _run(tmp_path, wheel_index, toml_extra, extra_record=None, runtime="v2-alpha-tpuv5", job=None, host_libtpu=""):
    store = LocalStore(tmp_path / "store")
    store.write(layout.CLUSTER_RECORD, json.dumps({"arch": "vm", "framework": "tensorflow", "runtime": runtime,
                                                   "tensorflow_from": "pip", "hosts": 1, **(extra_record or {})}).encode())
    job = job or make_job(tmp_path, PRINT_TF, toml_extra)
    spec = jobspec.load(str(job))
    run_id = submit_to_store(store, job)
    raw = json.loads(store.read(layout.run_job(run_id)))
    store.write(layout.run_job(run_id), json.dumps({
        **raw, "tensorflow": spec.tensorflow, "env": spec.env, "requirements": spec.requirements,
        "framework": spec.framework.value, "keras_backend": spec.keras_backend}).encode())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": wheel_index.url, "TPUCTL_TF_FIND_LINKS": wheel_index.url,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "TPUCTL_AGENT_HOME": str(tmp_path / "agent")}
    host = _bare_host(tmp_path, host_libtpu)
    agent = subprocess.Popen([str(host), "-m", "tpuctl.agent", "--store", str(tmp_path / "store"),
                              "--accelerator", "v3-8", "--tpu", "local", "--poll", "0.1"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def sleep(s):
        assert agent.poll() is None, agent.stdout.read().decode()   # a dead agent fails the test, never hangs it
        time.sleep(min(s, 0.1))
    try:
        out: list[bytes] = []
        st = runs.follow(store, run_id, out.append, sleep=sleep)
    finally:
        agent.terminate()
        agent.wait(10)
    return st, b"".join(out).decode(), tmp_path / "agent"


def test_a_job_gets_the_tensorflow_its_toml_asks_for_and_only_one(tmp_path, wheel_index):
    st, log, home = _run(tmp_path, wheel_index, 'tensorflow = "2.19"\n')
    assert st.state is runs.RunState.SUCCEEDED, log
    assert "version 2.19.1 from tensorflow-tpu" in log
    assert "distributions ['tensorflow-tpu']" in log          # one TensorFlow importable in the job's environment
    assert "keras tf_keras 2.19.0" in log                     # tf.keras is tf-keras (TF_USE_LEGACY_KERAS=1)
    assert "libtpu True" in log                                # PJRT pointed at the libtpu installed with it
    assert "installing tensorflow-tpu~=2.19.0 and tf-keras~=2.19.0 (--no-deps)" in log


def test_the_jobs_requirements_cannot_replace_the_tensorflow_installed_for_it(tmp_path, wheel_index):
    """tf-keras in requirements.txt (the BERT job's) would make pip resolve tf-keras's `Requires-Dist: tensorflow`
    and install PyPI's tensorflow over tensorflow-tpu's files: such lines are left out, and said so."""
    job = make_job(tmp_path / "req", PRINT_TF, 'requirements = "requirements.txt"\n')
    (job / "requirements.txt").write_text("tf-keras\n")
    st, log, _ = _run(tmp_path, wheel_index, 'requirements = "requirements.txt"\n', job=job)
    assert st.state is runs.RunState.SUCCEEDED, log
    assert "distributions ['tensorflow-tpu']" in log and "from tensorflow-tpu" in log, log
    assert "requirements.txt: tf-keras come with the TensorFlow installed for the job" in log


def test_the_default_line_and_an_exact_version(tmp_path, wheel_index):
    st, log, _ = _run(tmp_path, wheel_index, "")
    assert st.state is runs.RunState.SUCCEEDED and f"version {jobspec.DEFAULT_TENSORFLOW}." in log, log
    st, log, _ = _run(tmp_path / "exact", wheel_index, 'tensorflow = "2.20.0"\n')
    assert st.state is runs.RunState.SUCCEEDED and "version 2.20.0 from tensorflow-tpu" in log, log


def test_the_install_is_cached_on_the_host(tmp_path, wheel_index):
    _run(tmp_path, wheel_index, 'tensorflow = "2.20"\n')
    (tmp_path / "store").rename(tmp_path / "store-1")   # a new store, the same host (its agent home)
    st, log, _ = _run(tmp_path, wheel_index, 'tensorflow = "2.20"\n')
    assert st.state is runs.RunState.SUCCEEDED and "TensorFlow already installed" in log, log


@pytest.mark.parametrize("value", ["2", "latest", "2.20-tpu", "v2.20", "2.20.0.1"])
def test_a_tensorflow_key_that_is_not_a_version_is_refused(tmp_path, value):
    job = make_job(tmp_path, "print(1)\n", f'tensorflow = "{value}"\n')
    with pytest.raises(TpuctlError) as e:
        jobspec.load(str(job))
    assert e.value.exit_code == 2 and "'tensorflow'" in e.value.message


def test_tensorflow_loads_the_libtpu_python_finds_even_one_outside_the_jobs_environment(tmp_path, wheel_index):
    """Issue 36 item 3: tensorflow-tpu requires libtpu~=0.0.14 (fakes/pyindex.py); an image that ships libtpu 0.0.17
    outside the job's environment (Kaggle's) satisfies it, so pip installs none into the environment. PJRT is pointed
    at the libtpu Python finds, not at a path in the environment that does not exist (there `import tensorflow`
    raises FileNotFoundError and the job never starts)."""
    st, log, home = _run(tmp_path, wheel_index, 'tensorflow = "2.20"\n', host_libtpu="0.0.17")
    assert st.state is runs.RunState.SUCCEEDED, log
    host_site = next((tmp_path / "host-venv-libtpu-0.0.17").glob("lib/python*/site-packages"))
    assert f"tpuctl: TensorFlow's TPU library: {host_site / 'libtpu' / 'libtpu.so'}" in log, log
    assert "version 2.20.0 from tensorflow-tpu" in log and "libtpu True" in log
    assert not list((home / "envs").glob("*/lib/python*/site-packages/libtpu")), "pip installed a second libtpu"
