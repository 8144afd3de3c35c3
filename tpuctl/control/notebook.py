"""`tpuctl notebook JOB`: a notebook that runs the job on Colab's free TPU (or any Jupyter), since Colab has no API to
run one headlessly. It carries the job package, the run's data and tpuctl's own wheel inside it (base64), lays them
out as a Kaggle session finds its inputs, and runs the same session script (providers/kaggle/kernel.py), with its
working directory in a Google Drive folder: outputs and checkpoints persist there, so running the notebook again in
the next session resumes the job where the last one stopped.
"""
from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path

from ..core import datasync, packaging
from ..core.jobspec import JobSpec
from ..providers import agent_package
from ..providers.kaggle import kernel
from ..providers.kaggle.sessions import tar_files, grace_seconds

DATASET = "tpuctl-notebook"
COLAB_SESSION = 12 * 3600 - 20 * 60   # Colab's longest session is 12 hours (research.google.com/colaboratory/faq)

_SETUP = '''import base64, json, os, pathlib, sys
# Where the job's outputs, checkpoints and shared store live between sessions: a Google Drive folder on Colab
# (TPUCTL_NOTEBOOK_DIR elsewhere). Running this notebook again resumes the job from them.
JOB = @NAME@
if os.environ.get("TPUCTL_NOTEBOOK_DIR"):
    KEEP = pathlib.Path(os.environ["TPUCTL_NOTEBOOK_DIR"])
else:
    from google.colab import drive
    drive.mount("/content/drive")
    KEEP = pathlib.Path("/content/drive/MyDrive/tpuctl") / JOB
ROOT = pathlib.Path(os.environ.get("TPUCTL_NOTEBOOK_ROOT", "/content/tpuctl"))
INPUT = ROOT / "input" / @DATASET@
INPUT.mkdir(parents=True, exist_ok=True)
KEEP.mkdir(parents=True, exist_ok=True)
if not (ROOT / "working").exists():
    (ROOT / "working").symlink_to(KEEP, target_is_directory=True)
(KEEP / "tpuctl-continue").unlink(missing_ok=True)
import shutil
shutil.rmtree(ROOT / "temp", ignore_errors=True)   # the job is unpacked afresh at every run
FILES = @FILES@
for name, data in FILES.items():
    (INPUT / name).write_bytes(base64.b64decode(data))
print(f"job {JOB}: inputs ready; outputs and checkpoints in {KEEP}")
'''

_RUN = '''import subprocess
script = ROOT / "session.py"
script.write_text(@SCRIPT@)
proc = subprocess.Popen([sys.executable, "-u", str(script)], env=dict(os.environ, TPUCTL_KAGGLE_ROOT=str(ROOT)),
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
for line in proc.stdout:
    print(line, end="")
rc = proc.wait()
if (KEEP / "tpuctl-continue").exists():
    print("The session's time is up; the checkpoint is in Drive: run this notebook again to go on.")
elif rc != 0:
    raise RuntimeError(f"the job exited with code {rc}")
else:
    print(f"done: outputs in {KEEP / 'output'}")
'''


def build(job: JobSpec, args: list[str]) -> dict[str, object]:
    """The notebook (nbformat 4) as a dict, everything it needs inside it. TPUCTL_NOTEBOOK_SESSION_SECONDS: how
    long a session runs the job before it saves and stops (Colab's limit less a margin)."""
    files_in = [(rel, path) for path, rel in datasync.plan(job.data, job.data_as)]
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "job.tar.gz"
        packaging.build_file(job.root, job.data, pkg)
        inputs = {"job.tar.gz": pkg.read_bytes(), "tpuctl.whl": agent_package.build(),
                  "data.tar": tar_files({rel: path.read_bytes() for rel, path in files_in})}
    script = kernel.render({"run_id": f"notebook-{job.name}", "dataset": DATASET, "previous": "", "session": 1,
                            "command": job.command, "args": args, "env": job.env, "requirements": job.requirements,
                            "accelerator": "notebook",
                            "deadline": float(os.environ.get("TPUCTL_NOTEBOOK_SESSION_SECONDS", COLAB_SESSION)),
                            "grace": grace_seconds()})
    encoded = {n: base64.b64encode(b).decode() for n, b in inputs.items()}
    setup = (_SETUP.replace("@NAME@", repr(job.name)).replace("@DATASET@", repr(DATASET))
             .replace("@FILES@", json.dumps(encoded)))

    def cell(kind: str, text: str, n: int) -> dict[str, object]:
        c: dict[str, object] = {"cell_type": kind, "id": f"tpuctl-{n}", "metadata": {}, "source": text}
        if kind == "code":
            c.update(execution_count=None, outputs=[])
        return c
    intro = (f"# {job.name}, by tpuctl\n\nRuns `{job.command}` with the tpuctl job contract (TPUCTL_OUTPUT_DIR, "
             "TPUCTL_DATA_DIR, ...). On Colab pick a TPU runtime (Runtime, Change runtime type), then Run all. "
             "Outputs and checkpoints go to Google Drive (`MyDrive/tpuctl/" + job.name + "`): when the session ends, "
             "run the notebook again and the job resumes from its last checkpoint.")
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                         "accelerator": "TPU", "language_info": {"name": "python"}},
            "cells": [cell("markdown", intro, 1), cell("code", setup, 2),
                      cell("code", _RUN.replace("@SCRIPT@", repr(script)), 3)]}
