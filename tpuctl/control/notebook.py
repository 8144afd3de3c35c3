"""`tpuctl notebook JOB`: a notebook that runs the job on Colab's free TPU or on any Jupyter, since Colab has no API to
run one headlessly. It runs the Kaggle session script (tpuctl/host/session.py, shown as a cell of code) on the same
inputs a Kaggle session gets (kaggle/kernel.py `payload`: the job package, tpuctl's wheel, the run's data), carried
inside the notebook in a cell kept out of sight, or, past a size, the data read from a Drive folder or a gs:// URI
the user gives. The run's values are data (a JSON cell), never text substituted into code.

Colab as it is: the free TPU is one v5e chip (colabtools#5566: v2-8 retired), so the notebook carries the metadata
Colab writes for that runtime (`"colab": {"gpuType": "V5E1"}`, `"accelerator": "TPU"`: googlecolab/colab-vscode#63)
and the job sees one replica; its TPU runtimes ship no TensorFlow (colabtools#5164), so a TensorFlow job gets
tensorflow-tpu installed and the TPU checked as on Kaggle's TPU. Drive writes reach Drive late (colabtools#659): the
job writes locally, the notebook copies its output and store to Drive every few minutes and at the end (the job
stops itself before the session deadline, a notebook parameter), then `drive.flush_and_unmount()`. Running the
notebook again resumes the job from what is in Drive. Off Colab (no `google.colab`) the kept folder is a local one.
"""
from __future__ import annotations

import ast
import base64
import json
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from ..core import backends, datasync, knobs, packaging
from ..core.errors import bad_input
from ..core.jobspec import DEFAULT_TENSORFLOW, JobSpec
from ..providers import agent_package
from ..providers.kaggle import kernel
from ..providers.kaggle.inputs import tar_files
from ..providers.kaggle.kernel import grace_seconds

SESSION_HOURS = 11.5     # Colab's sessions end at 12 hours at most, free ones often sooner (Colab FAQ; colabtools#2107)
EMBED_LIMIT_MB = 20.0    # data past this is read from a Drive folder or gs:// URI, not carried as base64
_LINE = 100              # base64 characters per line of the payload cell


def build(job: JobSpec, args: list[str], data_uri: str = "", embed_limit_mb: float = EMBED_LIMIT_MB) -> dict[str, Any]:
    """The notebook (nbformat 4) as a dict. TPUCTL_NOTEBOOK_SESSION_SECONDS: the session deadline's default."""
    files_in = [] if data_uri else [(rel, path) for path, rel in datasync.plan(job.data, job.data_as)]
    size = sum(path.stat().st_size for _, path in files_in)
    if size > embed_limit_mb * 1e6:
        raise bad_input(f"the job's data is {size / 1e6:.1f} MB, more than a notebook should carry "
                        f"({embed_limit_mb:g} MB)", "copy it to Google Drive or a gs:// bucket and pass its folder: "
                        "`tpuctl notebook JOB --data-uri gs://BUCKET/PATH` (or /content/drive/MyDrive/PATH)")
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "job.tar.gz"
        packaging.build_file(job.root, job.data, pkg)
        digest, files = kernel.payload(pkg.read_bytes(), agent_package.build(),
                                       tar_files({rel: path.read_bytes() for rel, path in files_in}))
    seconds = knobs.number("TPUCTL_NOTEBOOK_SESSION_SECONDS", SESSION_HOURS * 3600)
    config = kernel.config({"run_id": f"notebook-{job.name}", "digest": digest, "previous": False, "session": 1,
                            "command": job.command, "args": args, "env": job.env, "requirements": job.requirements,
                            "framework": job.framework.value, "accelerator": "",
                            "tensorflow": (job.tensorflow or DEFAULT_TENSORFLOW) if _installs_tensorflow(job)
                            else "", "deadline": seconds, "grace": grace_seconds(),
                            "keras_backend": job.keras_backend, "platform": "notebook"})
    cells = [_cell("markdown", _intro(job)),
             _cell("code", _parameters({"SESSION_HOURS": round(seconds / 3600, 4), "KEEP": "", "DATA": data_uri,
                                        "SYNC_MINUTES": 10, "DRIVE": "/content/drive", "JOB": job.name})),
             _cell("code", _payload(files), hidden=True),
             _cell("code", _session_cell()),
             _cell("code", "CONFIG = " + json.dumps(config, indent=1) + "\n" + _RUN)]
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                         "language_info": {"name": "python"}, "accelerator": "TPU",
                         "colab": {"gpuType": "V5E1", "provenance": []}},
            "cells": [dict(c, id=f"tpuctl-{n}") for n, c in enumerate(cells, 1)]}


def _installs_tensorflow(job: JobSpec) -> bool:
    """Whether the notebook installs TensorFlow on a TPU (Colab's have none: colabtools#5164): for a TensorFlow job,
    and a Keras 3 job that forces its TensorFlow backend (else Keras runs on the runtime's JAX: core/backends.py)."""
    return job.framework.value == "tensorflow" or \
        (job.framework.value == "keras" and backends.forced(job.env, job.keras_backend)[0] == "tensorflow")


def _cell(kind: str, text: str, hidden: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"cellView": "form", "jupyter": {"source_hidden": True}} if hidden else {}
    c: dict[str, Any] = {"cell_type": kind, "metadata": meta, "source": text}
    if kind == "code":
        c.update(execution_count=None, outputs=[])
    return c


def _payload(files: dict[str, bytes]) -> str:
    """The inputs as base64 in lines of _LINE characters (b64decode skips the newlines), behind Colab's form view."""
    out = ["#@title The job's inputs (job package, tpuctl's wheel, data; base64: nothing to read here)",
           "PAYLOAD = {"]
    for name, data in sorted(files.items()):
        text = base64.b64encode(data).decode()
        out.append(f"    {name!r}: \"\"\"\n" + "\n".join(textwrap.wrap(text, _LINE)) + "\n\"\"\",")
    return "\n".join(out) + "\n}\n"


SESSION_INTRO = """\
# tpuctl's session script: it unpacks the job and its data from the cell above, installs what the job needs
# (TensorFlow for the TPU where the runtime has none), checks that the TPU is seen, then runs the job.
# Nothing here needs changing: the parameters are in the first code cell, and the last cell starts the run.

"""


def _session_cell() -> str:
    """The session script as a person running the notebook meets it: what it does and what to change first; its
    module docstring, a developer's notes citing repository paths and issue threads, stays in the repository."""
    source = kernel.source()
    first = ast.parse(source).body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        source = "\n".join(source.splitlines()[first.end_lineno:]).lstrip("\n") + "\n"
    return SESSION_INTRO + source


def _intro(job: JobSpec) -> str:
    return (f"# {job.name}, by tpuctl\n\n"
            f"Runs `{job.command}` with the tpuctl job contract (TPUCTL_OUTPUT_DIR, TPUCTL_DATA_DIR, ...).\n\n"
            "**On Colab**: Runtime, Change runtime type, **v5e-1 TPU** (the free TPU is a single v5e chip: one "
            "replica, so the job's global batch is its per-replica batch), then Run all. Its TPU runtime has no "
            "TensorFlow: a TensorFlow job gets `tensorflow-tpu` installed and the TPU checked before it starts. "
            f"Outputs and checkpoints go to Google Drive (`MyDrive/tpuctl/{job.name}`), copied there as the job runs "
            "and when it stops, before the session deadline (a parameter below): run the notebook again and the "
            "job resumes from its last checkpoint.\n\n"
            "**On any other Jupyter**: Run all; the job uses that environment's packages, outputs stay in a local "
            "folder. The cells: parameters, the inputs (hidden), the session script tpuctl runs on Kaggle too, "
            "and the run.")


_PARAMETERS = [
    ("SESSION_HOURS", "the job is asked to checkpoint and stop this long after the start (Colab ends sessions at "
                      "12 h, free ones often sooner)"),
    ("KEEP", "where outputs and checkpoints persist between runs; \"\": Drive's MyDrive/tpuctl/<job> on Colab, "
             "./tpuctl/<job> elsewhere"),
    ("DATA", "the job's data when it is not inside this notebook: a Drive folder or a gs:// URI"),
    ("SYNC_MINUTES", "how often the job's output is copied to KEEP while it runs"),
    ("DRIVE", "where Colab mounts Google Drive"),
    ("JOB", "the folder's name under MyDrive/tpuctl"),
]


def _parameters(values: dict[str, object]) -> str:
    return "# Parameters: edit, then Run all.\n" + "".join(
        f"{f'{name} = {values[name]!r}':<26}# {why}\n" for name, why in _PARAMETERS)


_RUN = '''
import base64, pathlib, subprocess, threading
try:
    from google.colab import drive   # Colab; any other Jupyter has no such module and keeps a local folder
except ImportError:
    drive = None
if drive is not None:
    drive.mount(DRIVE)
KEEP_DIR = pathlib.Path(KEEP or (f"{DRIVE}/MyDrive/tpuctl/{JOB}" if drive else f"tpuctl/{JOB}")).absolute()
ROOT = pathlib.Path("tpuctl-work").absolute()   # local: Drive writes sync late (colabtools#659)
INPUT, WORK = ROOT / "input" / "notebook", ROOT / "working"
for d in (INPUT, WORK, KEEP_DIR):
    d.mkdir(parents=True, exist_ok=True)
for name, text in PAYLOAD.items():
    (INPUT / name).write_bytes(base64.b64decode(text))
(WORK / CONFIG["names"]["continue_mark"]).unlink(missing_ok=True)
tpu = drive is not None or any(pathlib.Path(p).exists() for p in ("/dev/vfio/0", "/dev/accel0"))
data_from = DATA
if DATA.startswith("gs://"):
    if drive is not None:
        from google.colab import auth
        auth.authenticate_user()
    data_from = str(ROOT / "gs-data")
    pathlib.Path(data_from).mkdir(exist_ok=True)
    subprocess.run(["gcloud", "storage", "cp", "-r", DATA.rstrip("/") + "/*", data_from], check=True)
run = dict(CONFIG, root=str(ROOT), previous_dir=str(KEEP_DIR), data_from=data_from,
           deadline=SESSION_HOURS * 3600, accelerator="v5litepod-1" if tpu else "notebook",
           tensorflow=CONFIG["tensorflow"] if tpu else "")
line(f"job {JOB}: outputs and checkpoints kept in {KEEP_DIR}" +
      ("; Colab's free TPU is one v5e chip (v5e-1): one replica" if tpu else "; no TPU here: this Jupyter's packages"))
done = threading.Event()

def keep():
    for kept in (CONFIG["names"]["output"], CONFIG["names"]["store"]):
        copy_tree(WORK / kept, KEEP_DIR / kept)

def keep_every():
    while not done.wait(SYNC_MINUTES * 60):
        keep()

threading.Thread(target=keep_every, daemon=True).start()
try:
    rc = main(run)
finally:
    done.set()
    keep()
    if drive is not None:
        drive.flush_and_unmount()   # what was copied reaches Drive before the session can end
        line("Drive flushed and unmounted")
if (WORK / CONFIG["names"]["continue_mark"]).exists():
    line(f"The session's time is up; the checkpoint is in {KEEP_DIR}: run this notebook again to go on.")
elif rc != 0:   # 127: not prepared (inputs, install or TPU check: the line above says which)
    hint = "; on Colab: Runtime, Change runtime type, v5e-1 TPU" if rc == 127 and drive is not None else ""
    raise RuntimeError(f"the job exited with code {rc}{hint}")
else:
    line(f"done: outputs in {KEEP_DIR / CONFIG['names']['output']}")
'''
