"""`tpuctl notebook`: the notebook Colab runs, executed here with nbclient on this CPU: the job, its data and tpuctl's
wheel come from inside it, outputs persist in the kept folder (Drive on Colab), and a run longer than a session
resumes from its checkpoint when the notebook is run again."""
import json

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
    open(ck, "w").write(str(step))
    print("step", step, flush=True)
"""


def _run(path):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()   # the kernel inherits this environment
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_the_notebook_runs_the_job_and_resumes_it_in_the_next_session(env, cli, tmp_path, monkeypatch):
    (tmp_path / "greeting.txt").write_text("hello from the data\n")
    job = make_job(tmp_path, COUNTER)
    monkeypatch.setenv("TPUCTL_NOTEBOOK_SESSION_SECONDS", "1.0")
    monkeypatch.setenv("TPUCTL_KAGGLE_GRACE_SECONDS", "0.2")
    code, out, err = cli("notebook", str(job), "--data", str(tmp_path / "greeting.txt"), "-o", str(tmp_path / "j.ipynb"))
    assert code == 0, err
    doc = json.loads((tmp_path / "j.ipynb").read_text())
    assert doc["metadata"]["accelerator"] == "TPU" and "google.colab" in doc["cells"][1]["source"]
    keep = tmp_path / "drive"
    monkeypatch.setenv("TPUCTL_NOTEBOOK_DIR", str(keep))
    monkeypatch.setenv("TPUCTL_NOTEBOOK_ROOT", str(tmp_path / "content"))
    texts = []
    for _ in range(8):                       # each execution is a session; the kept folder carries the checkpoint
        texts.append(_run(tmp_path / "j.ipynb"))
        if "done: outputs in" in texts[-1]:
            break
    assert len(texts) >= 2 and "run this notebook again" in texts[0]
    assert "data says hello from the data" in texts[0] and "resuming at 0" in texts[0]
    assert f"resuming at {(keep / 'output' / 'step').read_text()}" not in texts[0]
    assert "step 10" in texts[-1] and (keep / "output" / "step").read_text() == "10"
    assert all("resuming at 0" not in t for t in texts[1:])
