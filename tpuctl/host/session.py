"""The script a Kaggle session runs (the kernel's text: providers/kaggle/kernel.py) and a tpuctl notebook runs as a
cell (control/notebook.py): the agent's job contract where no agent runs.

It finds the run's inputs by the marker files tpuctl uploaded, not by a path: Kaggle mounts a dataset at
/kaggle/input/datasets/<owner>/<slug>/ in 2026 sessions and at /kaggle/input/<slug>/ in older ones, a notebook's
output at /kaggle/input/notebooks/<owner>/<slug>/ (../../../shared/KAGGLE_FACTS.md, "Input mounts"). It checks
every input against the manifest uploaded with them (size and sha256) before anything runs: Kaggle unpacks
archives uploaded into a dataset (kaggle-cli PR #111, issues #292 and #406), so the inputs are uploaded as files
no backend takes for archives (providers/kaggle/kernel.py) and whatever arrived otherwise is named. Then: tpuctl's wheel onto
sys.path (tpuctl.runtime, the safe unpacker, the agent's install code), the job unpacked, the previous session's
output and store put back, TensorFlow installed where the image has none that drives a TPU (Kaggle's TPU image:
tensorflow-cpu, Kaggle/docker-python tpu/requirements.in; Colab: none, colabtools#5164) as the agent installs it
on a base runtime (jobenv.py), the TPU checked from that TensorFlow, and the job run with the TPUCTL_* environment,
its output without TensorFlow's start-up noise (preamble.py). Kaggle ends a session at its limit, so the job gets
a deadline a margin before it (TPUCTL_SESSION_DEADLINE, tpuctl.runtime.session_ending()), is stopped a grace after
that (SIGTERM, then SIGKILL) and the output is marked to continue: the next session resumes from the checkpoint.
A job may also ask for the next session by exiting with the continue code after writing its checkpoint.

Everything about the run arrives as data (`cfg`, decoded from JSON), never substituted into this text, so a job's
command, arguments and env reach it byte for byte. It uses the standard library until tpuctl's wheel is found.
"""
from __future__ import annotations

import codecs
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable

PREPARE_FAILED = 127   # as the agent's: the run could not be prepared (inputs missing or damaged, no TPU)
MAX_DEPTH = 3          # input/datasets/<owner>/<slug>/: the deepest folder a marker is looked for in
MAGIC = b"tpuctl payload 1\n"   # what each uploaded input begins with: no archive format starts so (kaggle/kernel.py)

TPU_PROBE = r'''
import sys
JAX_WORKS = ('JAX drives this TPU: run the job as Keras 3 (framework = "keras" in tpuctl.toml) on its JAX backend '
             '(docs/backends.md)')
try:
    import tensorflow as tf
except Exception as e:
    sys.exit(f"tpuctl: TensorFlow does not import in this session ({type(e).__name__}: {e}); {JAX_WORKS}")
why = ""
try:   # tpu="local": Colab's v5e answers "Please provide a TPU Name" to the resolver without one (colabtools#5717)
    tf.tpu.experimental.initialize_tpu_system(tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local"))
    cores = tf.config.list_logical_devices("TPU")
except Exception as e:
    cores, why = [], f"; {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
if not cores:
    kinds = sorted({d.device_type for d in tf.config.list_logical_devices()})
    sys.exit(f"tpuctl: TensorFlow {tf.__version__} from {tf.__file__} sees no TPU, only {', '.join(kinds) or 'nothing'}"
             f"{why}; {JAX_WORKS}")
print(f"tpuctl: TensorFlow {tf.__version__} sees {len(cores)} TPU core(s)", flush=True)
'''


def line(text: str) -> None:
    """One line in one write: print() writes the text and its newline apart, and a notebook kernel flushing between
    the two (ipykernel's OutStream flushes on a 0.2 s timer of its own) shows an output holding only the newline."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def say(text: str) -> None:
    line(f"tpuctl: {text}")


def find_marked(top: Path, names: list[str]) -> dict[str, Path]:
    """The folder each marker file lies in under `top`, down to MAX_DEPTH folders (sorted: the same answer each time)."""
    found: dict[str, Path] = {}
    for here, dirs, files in os.walk(top, followlinks=True):
        for name in set(names).intersection(files):
            found.setdefault(name, Path(here))
        depth = len(Path(here).relative_to(top).parts)
        dirs[:] = [] if depth >= MAX_DEPTH or len(found) == len(names) else sorted(dirs)
    return found


def what_is_there(top: Path) -> str:
    """The folders under `top` a marker was looked for in, for the message that says it is not there."""
    seen = sorted(str(Path(here).relative_to(top)) for here, _, _ in os.walk(top, followlinks=True)
                  if len(Path(here).relative_to(top).parts) == MAX_DEPTH or not next(os.walk(here))[1])
    return ", ".join(s for s in seen if s != ".")[:600] or "nothing"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verify(folder: Path, manifest: dict[str, Any]) -> list[str]:
    """What differs between the inputs in `folder` and the manifest uploaded with them, one phrase each."""
    problems = []
    for name, want in sorted(manifest["files"].items()):
        p = folder / name
        if p.is_dir():
            problems.append(f"{name} arrived as a folder (Kaggle unpacked it)")
        elif not p.is_file():
            problems.append(f"{name} is missing")
        elif p.stat().st_size != want["size"]:
            problems.append(f"{name} has {p.stat().st_size} bytes, not the {want['size']} uploaded")
        elif sha256(p) != want["sha256"]:
            problems.append(f"{name}'s sha256 is not the one uploaded")
    return problems


def open_payload(path: Path) -> BinaryIO:
    """An uploaded input, positioned after its MAGIC (checked already by verify's sha256)."""
    f = open(path, "rb")
    if f.read(len(MAGIC)) != MAGIC:
        f.close()
        raise ValueError(f"{path} is not a tpuctl input")
    return f


def locate(root: Path, cfg: dict[str, Any]) -> tuple[Path, Path | None] | str:
    """(the inputs' folder, the previous session's output or None), or why they cannot be had, in one line."""
    markers = [cfg["manifest"]] + ([cfg["previous_marker"]] if cfg.get("previous_marker") else [])
    found = find_marked(root / "input", markers)
    missing = [("the run's inputs" if m == cfg["manifest"] else "the previous session's output") + f" (marker {m})"
               for m in markers if m not in found]
    if missing:
        return (f"cannot find {' nor '.join(missing)} under {root / 'input'}; there: {what_is_there(root / 'input')}"
                " (is the dataset or the previous session attached?)")
    inputs = found[cfg["manifest"]]
    problems = verify(inputs, json.loads((inputs / cfg["manifest"]).read_text()))
    if problems:
        return f"the run's inputs in {inputs} are not what was uploaded: {'; '.join(problems)}"
    previous = found.get(cfg.get("previous_marker") or "") or (Path(cfg["previous_dir"]) if cfg.get("previous_dir")
                                                                  else None)
    return inputs, previous


def prepare(cfg: dict[str, Any], inputs: Path, previous: Path | None, work: Path, temp: Path) -> dict[str, Path]:
    """The wheel on sys.path, the job and its data unpacked, the previous session's output and store back."""
    names = cfg["names"]
    dirs = {"code": temp / "job", "data": temp / "data", "out": work / names["output"], "store": work / names["store"]}
    shutil.rmtree(dirs["code"], ignore_errors=True)   # unpacked afresh each session (a notebook run again)
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    with open_payload(inputs / "tpuctl.whl.bin") as f:
        (temp / "tpuctl.whl").write_bytes(f.read())
    dirs["wheel"] = temp / "tpuctl.whl"
    sys.path.insert(0, str(dirs["wheel"]))   # a pure-Python wheel imports as it is: no pip
    from tpuctl.core.packaging import unpack
    with open_payload(inputs / "job.tar.gz.bin") as f:
        unpack(f.read(), dirs["code"])
    with open_payload(inputs / "data.tar.bin") as f, tarfile.open(fileobj=f, mode="r:") as t:
        t.extractall(dirs["data"], filter="data")
    if cfg.get("data_from"):
        copy_tree(Path(cfg["data_from"]), dirs["data"])
        say(f"data from {cfg['data_from']} in {dirs['data']}")
    if previous is not None and any((previous / names[k]).is_dir() for k in ("output", "store")):
        for kept, here in ((names["output"], dirs["out"]), (names["store"], dirs["store"])):
            copy_tree(previous / kept, here)
        say(f"session {cfg['session']}: the previous session's output and store are back in {work}")
    return dirs


def copy_tree(src: Path, dest: Path) -> None:
    """`src` into `dest`, files whose size and modification time already match skipped (Drive copies are slow)."""
    if not src.is_dir():
        return
    for here, _, files in os.walk(src):
        target = dest / Path(here).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            a, b = Path(here) / name, target / name
            if not (b.is_file() and b.stat().st_size == a.stat().st_size
                    and int(b.stat().st_mtime) == int(a.stat().st_mtime)):
                shutil.copy2(a, b)


def environment(cfg: dict[str, Any], dirs: dict[str, Path], deadline_at: float) -> dict[str, str]:
    from tpuctl.core import backends
    from tpuctl.runtime import prefer_legacy_keras
    env = dict(os.environ, **cfg["env"])
    wheel = str(dirs["wheel"])
    env.update(TPUCTL_RUN_ID=cfg["run_id"], TPUCTL_OUTPUT_DIR=str(dirs["out"]), TPUCTL_DATA_DIR=str(dirs["data"]),
               TPUCTL_STORE=str(dirs["store"]), TPUCTL_ACCELERATOR=cfg["accelerator"], TPUCTL_SESSION=str(cfg["session"]),
               TPUCTL_WORKER="0", TPUCTL_NUM_WORKERS="1", PYTHONUNBUFFERED="1", TPUCTL_SESSION_DEADLINE=str(deadline_at),
               PYTHONPATH=os.pathsep.join([wheel] + [p for p in [os.environ.get("PYTHONPATH", "")] if p]))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")   # `python`: this interpreter
    if cfg.get("framework") == "keras":   # Keras 3 itself: tf.keras left as TensorFlow has it
        env[backends.ENV] = keras_backend(cfg)[0]   # the job's [env] value, else tpuctl's pick over the image's
        backends.keep_keras_3(env, cfg["env"])
    elif not cfg["tensorflow"]:
        prefer_legacy_keras(env)
    return env


def keras_backend(cfg: dict[str, Any]) -> tuple[str, str]:
    """(backend, why) for a Keras job here (core/backends.py): as forced, else JAX on Kaggle and Colab."""
    import importlib.util
    from tpuctl.core import backends
    name, where = backends.forced(cfg["env"], cfg.get("keras_backend", ""))
    if name:
        return name, f"forced by {where}"
    return backends.for_session(cfg.get("platform", ""), cfg["accelerator"],
                                importlib.util.find_spec("tensorflow") is not None)


def install(cfg: dict[str, Any], code: Path, temp: Path, env: dict[str, str], show: Callable[[bytes], None]) -> int:
    """The job's own environment (jobenv.py, as the agent makes it): TensorFlow first where cfg["tensorflow"] asks
    for it, then the job's requirements constrained so nothing replaces that TensorFlow; its python first on PATH."""
    from tpuctl.host import jobenv
    from tpuctl.host.tpuenv import tpu_environment
    tf, req = cfg["tensorflow"], cfg["requirements"]
    if not (tf or req):
        return 0
    env_dir, make = jobenv.plan(temp, code, req, temp, tf)
    rc = stream(["bash", "-c", "set -e\n" + make], code, env, show)
    env["PATH"] = str(env_dir / "bin") + os.pathsep + env["PATH"]
    if tf:
        if cfg.get("framework") != "keras":
            env.setdefault("TF_USE_LEGACY_KERAS", "1")   # tf-keras was installed beside it, as the agent sets it
        # the libtpu Python finds there, whichever distribution brought it (jobenv.FIND_LIBTPU): Kaggle's image has
        # libtpu 0.0.17 outside the environment, which satisfies tensorflow-tpu's libtpu~=0.0.14, so pip puts none in
        found = subprocess.run([str(env_dir / "bin" / "python"), "-c", jobenv.FIND_LIBTPU], env=env, text=True,
                               capture_output=True).stdout.strip()
        libtpu = found or str(jobenv.purelib(env_dir) / "libtpu" / "libtpu.so")
        # a single-host TPU VM, TensorFlow pip-installed: the PJRT pair Google's harness sets (tpuenv.py); Kaggle's
        # and Colab's TPUs are single-host v5e (or v2/v6e) VMs, whatever name the notebook gives the accelerator
        for k, v in tpu_environment("tensorflow", {"arch": "vm", "hosts": 1}, "v5litepod-8", libtpu).items():
            env.setdefault(k, v)
        if found and env.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH") == found:
            say(f"TensorFlow's TPU library: {found}")
    return rc


def stream(argv: list[str], cwd: Path, env: dict[str, str], show: Callable[[bytes], None],
           wait: Callable[[subprocess.Popen[bytes]], int] | None = None) -> int:
    """Runs argv in a session of its own, its output (stdout and stderr together) through `show`."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    out = proc.stdout

    def pump() -> None:
        while data := os.read(out.fileno(), 65536):
            show(data)
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    rc = wait(proc) if wait else proc.wait()
    reader.join(5)
    out.close()
    return rc


def run_job(cfg: dict[str, Any], code: Path, env: dict[str, str], deadline_at: float,
            show: Callable[[bytes], None]) -> int:
    """The job's command as written, through bash, with its arguments shell-quoted; stopped at the deadline."""
    command = cfg["command"] + "".join(" " + shlex.quote(a) for a in cfg["args"])
    say(f"session {cfg['session']} on {cfg['accelerator']}: {command}")

    def wait(job: subprocess.Popen[bytes]) -> int:
        left = deadline_at + cfg["grace"] - time.time()   # a job that watches the deadline stops itself in the grace
        try:
            return job.wait(timeout=max(left, 1))
        except subprocess.TimeoutExpired:
            say(f"the session's time is up ({cfg['deadline']:.0f}s): stopping the job, the next session resumes it")
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(timeout=cfg["grace"])
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
            return 0 if job.returncode == 0 else cfg["names"]["continue_code"]   # it may have finished then
    return stream(["bash", "-c", command], code, env, show, wait=wait)


def output_filter(cfg: dict[str, Any]) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """(show, end): the job's output to this process's stdout, TensorFlow's start-up preamble left out as the agent
    leaves it out (preamble.py; TPUCTL_TF_PREAMBLE=1 in the job's env keeps it)."""
    from tpuctl.host.preamble import PreambleFilter
    quiet = None if cfg["env"].get("TPUCTL_TF_PREAMBLE") == "1" else \
        PreambleFilter(gpu=cfg["accelerator"].startswith("gpu"))
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")   # a notebook's stdout takes text
    # Whole lines only (a `\r` ends one too, for progress bars): a notebook makes each write an output of its own,
    # and an unbuffered job writes `print("loss", x)` as four ("loss", " ", x, "\n": issue 40's empty outputs).
    held = [""]

    def show(data: bytes) -> None:
        s = held[0] + text.decode(quiet.feed(data) if quiet else data)
        cut = max(s.rfind("\n"), s.rfind("\r")) + 1
        held[0] = s[cut:]
        if cut:
            sys.stdout.write(s[:cut])
            sys.stdout.flush()

    def end() -> None:
        s = held[0] + text.decode(quiet.end() if quiet else b"", final=True)
        held[0] = ""
        if s:
            sys.stdout.write(s)
            sys.stdout.flush()
    return show, end


def finish(work: Path, names: dict[str, Any], rc: int) -> int:
    """The marks `tpuctl` reads from the session's output: the job's exit code, and whether to go on."""
    work.mkdir(parents=True, exist_ok=True)
    (work / names["exit"]).write_text(str(rc))
    if rc == names["continue_code"]:
        (work / names["continue_mark"]).write_text("")
        return 0
    return rc


def main(cfg: dict[str, Any]) -> int:
    """One session of the run `cfg` describes; its exit status (the job's, 0 when it is to go on)."""
    started = time.monotonic()
    root = Path(cfg.get("root") or os.environ.get("TPUCTL_KAGGLE_ROOT") or "/kaggle")   # the tests' fake sets it
    work, temp, names = root / "working", root / "temp" / "tpuctl", cfg["names"]
    work.mkdir(parents=True, exist_ok=True)
    (work / cfg["marker"]).write_text(json.dumps({"run_id": cfg["run_id"], "session": cfg["session"]}))
    found = locate(root, cfg)
    if isinstance(found, str):
        say(found)
        return finish(work, names, PREPARE_FAILED)
    inputs, previous = found
    say(f"inputs found in {inputs}, sizes and sha256 as uploaded")
    dirs = prepare(cfg, inputs, previous, work, temp)
    deadline_at = time.time() + cfg["deadline"] - (time.monotonic() - started)   # tpuctl.runtime.session_ending()
    env = environment(cfg, dirs, deadline_at)
    if cfg.get("framework") == "keras":
        from tpuctl.core import backends
        line(backends.line(*keras_backend(cfg)))
    show, end = output_filter(cfg)
    if install(cfg, dirs["code"], temp, env, show) != 0:
        end()
        say("installing the job's environment failed (pip's message above)")
        return finish(work, names, PREPARE_FAILED)
    if cfg["tensorflow"] and stream([shutil.which("python", path=env["PATH"]) or "python", "-c", TPU_PROBE],
                                    dirs["code"], env, show) != 0:
        end()
        return finish(work, names, PREPARE_FAILED)
    rc = run_job(cfg, dirs["code"], env, deadline_at, show)
    end()
    return finish(work, names, rc)
