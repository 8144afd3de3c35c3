"""The script a Kaggle session runs (a private `script` kernel): the agent's job contract, in a notebook service.

It finds the run's dataset under /kaggle/input (the job package, tpuctl's own wheel, which `tpuctl.runtime` and the
safe unpacker come from, and the run's data), unpacks the job, puts the previous session's output (an attached
kernel source) back where the job left it, and its store (TPUCTL_STORE: what it prepared once for all its
sessions), installs the job's requirements, runs its command with the environment
the agent gives (TPUCTL_OUTPUT_DIR under /kaggle/working, which Kaggle keeps as the session's output;
TPUCTL_DATA_DIR; TPUCTL_RUN_ID; ...), and ends with the job's exit code. Kaggle stops a session at its time limit,
so the script gives the job a deadline a margin before it (TPUCTL_SESSION_DEADLINE: `tpuctl.runtime.session_ending()`),
stops it a grace after that (SIGTERM, then SIGKILL), and marks the output `tpuctl-continue`: the next session
resumes from the checkpoint the job wrote. A job may also ask for the next
session itself by exiting with CONTINUE_CODE after writing its checkpoint (a job that catches SIGTERM to save one
should exit so too: an exit 0 after the stop reads as finished).
"""
from __future__ import annotations

import json

CONTINUE_CODE = 85        # a job's "checkpoint written, continue in the next session"
CONTINUE_MARK = "tpuctl-continue"
EXIT_MARK = "tpuctl-exit"
OUTPUT = "output"         # under /kaggle/working: the job's TPUCTL_OUTPUT_DIR
STORE = "store"           # under /kaggle/working: TPUCTL_STORE, what a job shares across its sessions (the BERT
                          # job's prepared data: prepared once per run, not once per session)

_SCRIPT = r'''
import json, os, shlex, shutil, signal, subprocess, sys, tarfile, time
from pathlib import Path

CFG = json.loads(@CFG@)
started = time.monotonic()
ROOT = Path(os.environ.get("TPUCTL_KAGGLE_ROOT", "/kaggle"))   # the tests' simulated session sets it
inp, work, temp = ROOT / "input" / CFG["dataset"], ROOT / "working", ROOT / "temp" / "tpuctl"
wheel = str(inp / "tpuctl.whl")
sys.path.insert(0, wheel)   # a pure-Python wheel imports as it is: tpuctl.runtime and the unpacker, no pip
from tpuctl.core.packaging import unpack
from tpuctl.runtime import prefer_legacy_keras

def say(text):
    print(f"tpuctl: {text}", flush=True)

code, data, out, store = temp / "job", temp / "data", work / "@OUTPUT@", work / "@STORE@"
for d in (code, data, out, store):
    d.mkdir(parents=True, exist_ok=True)
unpack((inp / "job.tar.gz").read_bytes(), code)
with tarfile.open(inp / "data.tar") as t:
    t.extractall(data, filter="data")
if CFG["previous"]:
    for kept, here in (("@OUTPUT@", out), ("@STORE@", store)):
        before = ROOT / "input" / CFG["previous"] / kept
        if before.is_dir():
            shutil.copytree(before, here, dirs_exist_ok=True)
    say(f"session {CFG['session']}: the previous session's output and store are back in {work}")
env = dict(os.environ, **CFG["env"])
deadline_at = time.time() + CFG["deadline"] - (time.monotonic() - started)   # tpuctl.runtime.session_ending()
env.update(TPUCTL_RUN_ID=CFG["run_id"], TPUCTL_OUTPUT_DIR=str(out), TPUCTL_DATA_DIR=str(data), TPUCTL_STORE=str(store),
           TPUCTL_ACCELERATOR=CFG["accelerator"], TPUCTL_SESSION=str(CFG["session"]),
           TPUCTL_WORKER="0", TPUCTL_NUM_WORKERS="1", PYTHONUNBUFFERED="1", TPUCTL_SESSION_DEADLINE=str(deadline_at),
           PYTHONPATH=os.pathsep.join([wheel] + [p for p in [os.environ.get("PYTHONPATH", "")] if p]))
env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")   # `python`: this interpreter
prefer_legacy_keras(env)
if CFG["requirements"]:
    say(f"installing {CFG['requirements']}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-r", str(code / CFG["requirements"])], check=True)
command = CFG["command"] + "".join(" " + shlex.quote(a) for a in CFG["args"])
say(f"session {CFG['session']} on {CFG['accelerator']}: {command}")
job = subprocess.Popen(["bash", "-c", command], cwd=code, env=env, start_new_session=True)
left = deadline_at + CFG["grace"] - time.time()   # a job that watches the deadline stops itself in the grace
try:
    rc = job.wait(timeout=max(left, 1))
except subprocess.TimeoutExpired:
    say(f"the session's time is up ({CFG['deadline']:.0f}s): stopping the job, the next session resumes it")
    os.killpg(job.pid, signal.SIGTERM)
    try:
        job.wait(timeout=CFG["grace"])
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    rc = 0 if job.returncode == 0 else @CONTINUE@   # it may have finished in that very moment
(work / "@EXIT@").write_text(str(rc))
if rc == @CONTINUE@:
    (work / "@CONTINUE_MARK@").write_text("")
    sys.exit(0)
sys.exit(rc)
'''


def render(cfg: dict[str, object]) -> str:
    """The script for one session; `cfg`: run_id, dataset, previous (kernel slug or ""), session, command, args, env,
    requirements, accelerator, deadline and grace (seconds)."""
    return (_SCRIPT.replace("@CFG@", repr(json.dumps(cfg))).replace("@OUTPUT@", OUTPUT)
            .replace("@CONTINUE_MARK@", CONTINUE_MARK).replace("@CONTINUE@", str(CONTINUE_CODE))
            .replace("@EXIT@", EXIT_MARK).replace("@STORE@", STORE)).lstrip()
