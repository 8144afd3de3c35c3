"""`tpuctl notebook`: the notebook executed with nbclient, on a plain Jupyter (no `google.colab`: a local kept folder,
this environment's packages) and on a simulated Colab TPU runtime (a `google.colab` stand-in whose Drive is a local
folder, an interpreter with no TensorFlow, a one-chip simulated TPU): the job, its data and tpuctl's wheel come from
inside it, outputs persist in the kept folder, and a run longer than a session resumes from its checkpoint when the
notebook is run again."""
import json
import re
from pathlib import Path

import pytest

from jobs import make_job

COUNTER = """
import os, time
print("data says", open(os.path.join(os.environ["TPUCTL_DATA_DIR"], "greeting.txt")).read().strip(), flush=True)
ck = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "step")
start = int(open(ck).read()) if os.path.exists(ck) else 0
print("resuming at", start, flush=True)
for step in range(start + 1, 11):
    time.sleep(0.2)
    open(ck + ".new", "w").write(str(step))   # then renamed: a session that ends at any moment leaves a whole one
    os.replace(ck + ".new", ck)
    print("step", step, flush=True)
"""
MARKERS = "@OUTPUT@ @EXIT@ @CONTINUE@ @CONTINUE_MARK@ @STORE@"

# google.colab's drive module as the notebook uses it (colabtools google/colab/drive.py: mount(mountpoint,
# force_remount=False, timeout_ms=120000, readonly=False), flush_and_unmount(timeout_ms=...)): My Drive appears at
# <mountpoint>/MyDrive; here it is the folder FAKE_DRIVE, and each flush is counted in it.
DRIVE = '''import os, pathlib

def mount(mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
    link = pathlib.Path(mountpoint) / "MyDrive"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(os.environ["FAKE_DRIVE"], target_is_directory=True)

def flush_and_unmount(timeout_ms=24 * 60 * 60 * 1000):
    flushed = pathlib.Path(os.environ["FAKE_DRIVE"]) / ".flushed"
    flushed.write_text(str(int(flushed.read_text() if flushed.exists() else 0) + 1))
'''


def _run(path, cwd, kernel="python3", **params):
    """Executes the notebook as Run all does, after setting its parameters (the second cell) as a user would."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    for name, value in params.items():
        nb.cells[1].source = re.sub(rf"^{name} = .*$", f"{name} = {value!r}", nb.cells[1].source, flags=re.M)
    NotebookClient(nb, timeout=180, kernel_name=kernel, resources={"metadata": {"path": str(cwd)}}).execute()
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def _sessions(path, cwd, kernel="python3", **params):
    texts = []
    for _ in range(8):                       # each execution is a session; the kept folder carries the checkpoint
        texts.append(_run(path, cwd, kernel, **params))
        if "done: outputs in" in texts[-1]:
            break
    return texts


def test_on_any_jupyter_the_notebook_runs_the_job_and_resumes_it(env, cli, tmp_path, monkeypatch):
    (tmp_path / "greeting.txt").write_text("hello from the data\n")
    job = make_job(tmp_path, COUNTER + "print('env', os.environ['MARKS'])\n", f'[env]\nMARKS = "{MARKERS}"\n')
    (job / "tpuctl.toml").write_text((job / "tpuctl.toml").read_text().replace(
        'command = "python main.py"', f'command = "echo cmd {MARKERS} && python main.py"'))
    monkeypatch.setenv("TPUCTL_KAGGLE_GRACE_SECONDS", "0.2")
    code, out, err = cli("notebook", str(job), "--data", str(tmp_path / "greeting.txt"), "-o", str(tmp_path / "j.ipynb"),
                         "--", *MARKERS.split())
    assert code == 0, err
    doc = json.loads((tmp_path / "j.ipynb").read_text())
    # readable: the session script as code, the run's values as JSON, the payload hidden and in short lines
    params, payload, script, run = doc["cells"][1:]
    assert "def main(cfg" in script["source"] and "@CFG@" not in script["source"]
    assert payload["metadata"]["jupyter"]["source_hidden"] and payload["metadata"]["cellView"] == "form"
    assert max(len(line) for c in doc["cells"][1:] for line in c["source"].splitlines()) <= 200
    assert doc["metadata"]["colab"]["gpuType"] == "V5E1" and doc["metadata"]["accelerator"] == "TPU"
    work = tmp_path / "jupyter"
    work.mkdir()
    texts = _sessions(tmp_path / "j.ipynb", work, SESSION_HOURS=1.0 / 3600)
    keep = work / "tpuctl" / "job"
    assert len(texts) >= 2 and "run this notebook again" in texts[0], texts[0]
    assert "data says hello from the data" in texts[0] and "resuming at 0" in texts[0]
    assert f"cmd {MARKERS}\n" in texts[-1] and f"env {MARKERS}\n" in texts[-1]   # as written: data, not a template
    # step 10 printed by whichever session reached it: a loaded machine can end that session between the job's last
    # checkpoint and its exit, and the next one then only resumes at 10 and finishes
    assert any("step 10" in t for t in texts) and (keep / "output" / "step").read_text() == "10"
    assert all("resuming at 0" not in t for t in texts[1:])


PRINT_TF = """import os, tensorflow as tf
print("tensorflow", tf.__version__, "from", tf.__distribution__, "tpu cores", len(tf.config.list_logical_devices("TPU")),
      "accelerator", os.environ["TPUCTL_ACCELERATOR"], flush=True)
"""


# Watches Drive from a thread while the job counts: a step this session wrote, seen in Drive while the job still
# runs, can only have come by the periodic copy (each session starts from what Drive held). Watched from the first
# step on, not only for the last: a session that reaches step 10 near its end is stopped before the copy shows it
# (CI's loaded run), and the line would then be in no session's output.
KEPT_WHILE_RUNNING = """
import threading
def _watch():
    ck = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "step")
    mine = int(open(ck).read()) if os.path.exists(ck) else 0
    kept = os.path.join(os.environ["FAKE_DRIVE"], "tpuctl", "job", "output", "step")
    while True:
        try:
            if int(open(kept).read()) > mine:
                print("a step of this session in Drive while the job runs", flush=True)
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
threading.Thread(target=_watch, daemon=True).start()
"""


@pytest.fixture(params=["", "0.0.17"], ids=["no-libtpu", "libtpu-0.0.17"])
def colab(tmp_path, monkeypatch, wheel_index, request):
    """A Colab TPU runtime: an interpreter without TensorFlow (kernelspec `colab`), google.colab's drive module,
    one simulated TPU chip, and the package index standing in for the internet. Colab's TPU runtimes ship JAX
    (colabtools#5164, #5174), so very likely a libtpu outside any environment a notebook makes, at a version no
    source states: run without one and with one that satisfies tensorflow-tpu's libtpu~=0.0.14 (issue 36)."""
    return _colab(tmp_path, monkeypatch, wheel_index, request.param)


def _colab(tmp_path, monkeypatch, wheel_index, libtpu="", jax_site=None):
    from fakes.kaggle import image_python
    name = "colab-image" + (f"-libtpu-{libtpu}" if libtpu else "") + ("-jax" if jax_site else "")
    python = image_python(tmp_path, name, tensorflow_cpu=False, libtpu=libtpu, jax_site=jax_site)
    assert "No module named 'tensorflow'" in __import__("subprocess").run(
        [str(python), "-c", "import tensorflow"], capture_output=True, text=True).stderr
    spec = tmp_path / "jupyter" / "kernels" / "colab"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [str(python), "-m", "ipykernel_launcher", "-f",
                                                           "{connection_file}"], "display_name": "Colab",
                                                  "language": "python"}))
    stand_in = tmp_path / "colab-modules" / "google" / "colab"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("")
    (stand_in / "drive.py").write_text(DRIVE)
    drive = tmp_path / "my-drive"
    drive.mkdir()
    for k, v in {"JUPYTER_PATH": str(tmp_path / "jupyter"), "PYTHONPATH": str(tmp_path / "colab-modules"),
                 "FAKE_DRIVE": str(drive), "FAKE_TPU_CORES": "1", "PIP_NO_INDEX": "1",
                 "PIP_FIND_LINKS": wheel_index.url, "TPUCTL_TF_FIND_LINKS": wheel_index.url}.items():
        monkeypatch.setenv(k, v)
    return drive


def test_on_colab_the_notebook_installs_tensorflow_and_keeps_checkpoints_in_drive(env, cli, tmp_path, monkeypatch,
                                                                                   colab):
    (tmp_path / "greeting.txt").write_text("hello from the data\n")
    job = make_job(tmp_path, PRINT_TF + "import time\n" + KEPT_WHILE_RUNNING + COUNTER, 'tensorflow = "2.20"\n')
    monkeypatch.setenv("TPUCTL_KAGGLE_GRACE_SECONDS", "0.2")
    assert cli("notebook", str(job), "--data", str(tmp_path / "greeting.txt"), "-o", str(tmp_path / "j.ipynb"))[0] == 0
    content = tmp_path / "content"
    content.mkdir()
    texts = _sessions(tmp_path / "j.ipynb", content, "colab", SESSION_HOURS=2.5 / 3600, DRIVE=str(content / "drive"),
                      SYNC_MINUTES=0.2 / 60)
    assert any("a step of this session in Drive while the job runs" in t for t in texts), texts
    assert len(texts) >= 2 and "run this notebook again" in texts[0], texts[0]
    assert "installing tensorflow-tpu~=2.20.0" in texts[0] and "TensorFlow 2.20.0 sees 1 TPU core(s)" in texts[0]
    assert "tensorflow 2.20.0 from tensorflow-tpu tpu cores 1 accelerator v5litepod-1" in texts[0]
    assert "tpuctl: TensorFlow's TPU library: " in texts[0]
    assert "one v5e chip (v5e-1)" in texts[0] and "Drive flushed and unmounted" in texts[0]
    kept = colab / "tpuctl" / "job"
    assert (kept / "output" / "step").read_text() == "10" and "step 10" in texts[-1]
    assert int((colab / ".flushed").read_text()) == len(texts)      # every session ends with Drive flushed
    assert all("resuming at 0" not in t for t in texts[1:])


def test_on_colab_a_keras_job_runs_on_the_runtimes_jax_with_nothing_installed(env, cli, tmp_path, monkeypatch,
                                                                            wheel_index, jax_python):
    """Issue 36: Colab's TPU runtimes have JAX and no TensorFlow (colabtools#5174): a Keras 3 job runs there on JAX,
    the backend said before the job starts, nothing installed."""
    site = next(jax_python.parent.parent.glob("lib/python*/site-packages"))
    _colab(tmp_path, monkeypatch, wheel_index, "0.0.17", jax_site=site)
    monkeypatch.setenv("TPUCTL_KAGGLE_GRACE_SECONDS", "0.2")
    keras_job = Path(__file__).parent / "keras_job"
    assert cli("notebook", str(keras_job), "-o", str(tmp_path / "k.ipynb"))[0] == 0
    content = tmp_path / "content"
    content.mkdir()
    text = _run(tmp_path / "k.ipynb", content, "colab", DRIVE=str(content / "drive"))
    assert "tpuctl: keras backend jax (Colab's TPU runtimes have JAX and no TensorFlow)" in text, text
    assert "backend jax KERAS_BACKEND jax" in text and "loss fell" in text and "install" not in text, text


def test_data_past_the_limit_is_read_from_where_the_user_put_it(env, cli, tmp_path, monkeypatch):
    (tmp_path / "greeting.txt").write_text("hello from the data\n" * 100)
    job = make_job(tmp_path, COUNTER.replace("range(start + 1, 11)", "range(1)"))
    code, out, err = cli("notebook", str(job), "--data", str(tmp_path / "greeting.txt"), "-o", str(tmp_path / "j.ipynb"),
                         "--embed-limit-mb", "0.001")
    assert code == 2 and "--data-uri" in err and "Traceback" not in err, err
    drive = tmp_path / "drive-data"
    drive.mkdir()
    (drive / "greeting.txt").write_text("hello from Drive\n")
    code, out, err = cli("notebook", str(job), "--data", str(tmp_path / "greeting.txt"), "-o", str(tmp_path / "j.ipynb"),
                         "--embed-limit-mb", "0.001", "--data-uri", str(drive))
    assert code == 0, err
    work = tmp_path / "jupyter"
    work.mkdir()
    assert "data says hello from Drive" in _run(tmp_path / "j.ipynb", work, DATA=str(drive))


def test_the_session_cell_opens_with_sentences_for_a_person_and_no_developer_notes(env, cli, tmp_path):
    """Issue 40: the 306-line session cell opened with a docstring citing repository paths and issue numbers."""
    job = make_job(tmp_path, "print('hi')\n")
    assert cli("notebook", str(job), "-o", str(tmp_path / "j.ipynb"))[0] == 0
    cells = json.loads((tmp_path / "j.ipynb").read_text())["cells"]
    session = next(c["source"] for c in cells if "def main(" in c["source"])
    head = session.split("\n\n", 1)[0]
    assert head.startswith("# tpuctl's session script") and 2 <= len(head.splitlines()) <= 4
    assert "Nothing here needs changing" in head
    assert '"""The script a Kaggle session runs' not in session
    assert not re.search(r"issue|#\d|KAGGLE_FACTS|colabtools|kaggle-cli", session.split("from __future__", 1)[0])


def test_the_job_s_lines_are_whole_outputs_never_empty_ones(env, cli, tmp_path):
    """Issue 40: each job line was followed by an empty output. An unbuffered job writes `print("step", n)` in four
    pieces; the notebook shows whole lines."""
    job = make_job(tmp_path, "for n in range(3):\n    print('step', n)\n", '[env]\nPYTHONUNBUFFERED = "1"\n')
    assert cli("notebook", str(job), "-o", str(tmp_path / "j.ipynb"))[0] == 0
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient
    nb = nbformat.read(str(tmp_path / "j.ipynb"), as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert all(t.strip() for t in texts), texts
    assert any(t.startswith("step 0\n") for t in texts), texts
