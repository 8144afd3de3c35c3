"""The job spec, `tpuctl.toml` at the job directory's root. Every problem is an input error naming the key."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .config import tomllib
from . import backends, packaging
from .errors import TpuctlError, bad_input
from .models import Framework

FILE = "tpuctl.toml"
_TYPES = {"command": str, "name": str, "data": list, "requirements": str, "env": dict, "framework": str,
          "tensorflow": str, "keras_backend": str}
# The TensorFlow a job gets on a TPU VM made on a base runtime (the host installs tensorflow-tpu of this version, as
# Google's own TF release tests do): the newest line Google publishes as tensorflow-tpu (its libtpu TF release index
# and PyPI list 2.16.1 to 2.20.0). The local extra's TensorFlow is tested on its newest release, 2.21: no
# tensorflow-tpu exists for that line.
DEFAULT_TENSORFLOW = "2.20"
_TF_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class JobSpec:
    root: Path
    command: str
    name: str
    data: list = field(default_factory=list)      # resolved local paths
    data_as: list = field(default_factory=list)   # where each lands under TPUCTL_DATA_DIR (relative)
    requirements: str = ""                        # path relative to root
    env: dict = field(default_factory=dict)
    framework: Framework = Framework.TENSORFLOW
    tensorflow: str = DEFAULT_TENSORFLOW          # major.minor or an exact version; "" for other frameworks
    keras_backend: str = ""                       # framework = "keras": the backend forced ("" lets tpuctl pick)


def _a_file(job_dir: str, path: Path) -> TpuctlError:
    """A file given where the job's directory goes (`submit train.py`, `submit job/tpuctl.toml`): what it is and
    what is wanted, naming the folder beside it when that folder is a job (issue 52)."""
    folder = path.parent
    shown = str(folder)
    if (folder / FILE).is_file():
        hint = f"pass the folder holding it: {shown}" if path.name == FILE else \
            f"pass the folder instead: {shown} (its {FILE} says what runs)"
    elif path.suffix == ".py":
        hint = f'put {path.name} in a folder with a {FILE} saying command = "python {path.name}", and pass the folder'
    else:
        hint = f"pass a directory holding {FILE}"
    return bad_input(f"{job_dir} is a file, and JOB_DIR is the job's folder: the directory holding {FILE}", hint)


def load(job_dir: str, extra_data: Sequence[str] = ()) -> JobSpec:
    root = Path(job_dir)
    if root.exists() and not root.is_dir():
        raise _a_file(job_dir, root)
    if not root.is_dir():
        raise bad_input(f"job directory {job_dir} does not exist", "pass a directory holding tpuctl.toml")
    root = root.resolve()
    f = root / FILE
    if not f.is_file():
        raise bad_input(f"{job_dir} has no {FILE}", 'create one with at least: command = "python train.py"')
    try:
        doc = tomllib.loads(f.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise bad_input(f"{f}: {e}", "fix the TOML syntax")
    for key, value in doc.items():
        if key not in _TYPES:
            raise bad_input(f"{f}: unknown key {key!r}", "known keys: " + ", ".join(_TYPES))
        if not isinstance(value, _TYPES[key]):
            raise bad_input(f"{f}: {key!r} must be a {_TYPES[key].__name__}, not {type(value).__name__}",
                            'e.g. command = "python train.py", data = ["data/corpus.txt"]')
    if not doc.get("command", "").strip():
        raise bad_input(f"{f}: 'command' is required", 'e.g. command = "python train.py"')
    name = doc.get("name", root.name)
    if not _NAME_RE.match(name):
        raise bad_input(f"{f}: 'name' {name!r} is not a valid job name", "letters, digits, '.', '_', '-'")
    data: list[Path] = []
    data_as: list[str] = []
    in_toml = len(doc.get("data", []))
    for i, item in enumerate(list(doc.get("data", [])) + list(extra_data)):
        if not isinstance(item, str):
            raise bad_input(f"{f}: 'data' entry {i} must be a string path", 'data = ["data/corpus.txt"]')
        p = Path(item) if Path(item).is_absolute() else (root / item if i < in_toml else Path(item))
        where = "'data'" if i < in_toml else "--data"
        if not p.exists():
            raise bad_input(f"{where} path {item} does not exist", "fix the path, or remove it")
        p = p.resolve()
        # What the job sees under TPUCTL_DATA_DIR: a path inside the job directory keeps its path relative to it;
        # anything else (absolute, or --data) is placed by its base name.
        placed = p.relative_to(root).as_posix() if i < in_toml and root in p.parents else p.name
        clash = next((n for n in data_as if n == placed or n.startswith(placed + "/") or placed.startswith(n + "/")),
                     None)
        if clash is not None:
            raise bad_input(f"{where} path {item} would land at {placed} in the run's data, where {clash} already is",
                            "rename one of them, or keep both inside the job directory so their paths tell them apart")
        data.append(p)
        data_as.append(placed)
    req = doc.get("requirements", "")
    if req and not (root / req).is_file():
        raise bad_input(f"{f}: 'requirements' file {req} does not exist", "fix the path, or remove the key")
    if req and Path(req).as_posix() not in packaging.files(root, data):
        # the host installs it from the unpacked package: outside the job, or excluded, it would not be there
        raise bad_input(f"{f}: 'requirements' file {req} is not part of the job package (outside the job "
                        "directory, excluded by .tpuctlignore, or under a data path)",
                        "put the requirements file inside the job directory, and not under an excluded path")
    env = doc.get("env", {})
    for k, v in env.items():
        if not _ENV_RE.match(k) or not isinstance(v, (str, int, float, bool)):
            raise bad_input(f"{f}: [env] {k!r} must be a NAME = \"value\" pair", 'e.g. [env] BATCH = "32"')
    try:
        framework = Framework(doc.get("framework", Framework.TENSORFLOW.value))
    except ValueError:
        raise bad_input(f"{f}: 'framework' must be one of " + ", ".join(x.value for x in Framework),
                        'e.g. framework = "jax" (every worker runs the command; tensorflow: worker 0 only; '
                        'keras: Keras 3, its backend picked by tpuctl)')
    tensorflow = doc.get("tensorflow", DEFAULT_TENSORFLOW)
    if not _TF_RE.match(tensorflow):
        raise bad_input(f"{f}: 'tensorflow' {tensorflow!r} is not a TensorFlow version",
                        'a major.minor line or an exact release: tensorflow = "2.20" or "2.19.1"')
    uses_tf = framework in (Framework.TENSORFLOW, Framework.KERAS)   # a Keras job may run on TensorFlow
    if "tensorflow" in doc and not uses_tf:
        raise bad_input(f"{f}: 'tensorflow' is for TensorFlow jobs, not {framework.value} ones", "remove the key")
    keras_backend = _keras_backend(f, doc, framework, env)
    return JobSpec(root=root, command=doc["command"], name=name, data=data, data_as=data_as, requirements=req,
                   env={k: str(v) for k, v in env.items()}, framework=framework,
                   tensorflow=tensorflow if uses_tf else "", keras_backend=keras_backend)


def _keras_backend(f: Path, doc: dict, framework: Framework, env: dict) -> str:
    """tpuctl.toml's `keras_backend`: one of backends.BACKENDS, for a Keras job, agreeing with [env] KERAS_BACKEND."""
    if framework is Framework.KERAS and backends.ENV in env:
        backends.check_forced(f"{f}: [env] {backends.ENV}", str(env[backends.ENV]))
    value = doc.get("keras_backend", "")
    if not value:
        return ""
    if framework is not Framework.KERAS:
        raise bad_input(f"{f}: 'keras_backend' is for Keras 3 jobs, not {framework.value} ones",
                        'add framework = "keras", or remove the key')
    backends.check_forced(f"{f}: 'keras_backend'", str(value))
    if str(env.get(backends.ENV, value)) != value:
        raise bad_input(f"{f}: 'keras_backend' {value!r} and [env] {backends.ENV} {env[backends.ENV]!r} disagree",
                        "keep one of them")
    return str(value)


# Linux refuses, with E2BIG, any one argument or environment string longer than MAX_ARG_STRLEN, 32 pages: 131072
# bytes with 4 KiB pages, its terminating NUL included (include/uapi/linux/binfmts.h `#define MAX_ARG_STRLEN
# (PAGE_SIZE * 32)`; fs/exec.c copy_strings: `if (len > MAX_ARG_STRLEN) goto out` with -E2BIG). The host runs the
# command as one `bash -c SCRIPT` argument, with up to SCRIPT_OWN bytes of the agent's own lines (host/attempt.py).
MAX_ARG_STRLEN = 32 * 4096
SCRIPT_OWN = 8 * 1024


def check_launchable(command: str, args: Sequence[str], env: dict[str, str]) -> None:
    """What the host could never start, refused at submit before anything is uploaded (issue 38.3): a NUL byte (a
    C string ends there: Python's exec refuses it, 'embedded null byte'), or a command or [env] entry longer than
    the kernel takes for one string. The run would otherwise wait on the host with the reason in its log only."""
    for what, text in [("the command", command), *((f"argument {i}", a) for i, a in enumerate(args, 1)),
                       *((f"[env] {k}", f"{k}={v}") for k, v in env.items())]:
        if "\0" in text:
            raise bad_input(f"{what} holds a NUL byte (\\0): no program can be given one",
                            "remove it (a TOML \\u0000 escape, or a file pasted with one)")
        size = len(text.encode())
        if size + 1 > MAX_ARG_STRLEN:
            raise bad_input(f"{what} is {size} bytes: Linux takes at most {MAX_ARG_STRLEN - 1} in one argument or "
                            "environment entry", "put the value in a file inside the job directory and read it "
                            "from there")
    script = len(command.encode()) + sum(len(a.encode()) * 4 + 3 for a in args)   # shell-quoted, at worst
    if script + SCRIPT_OWN + 1 > MAX_ARG_STRLEN:
        raise bad_input(f"the command with its arguments is about {script} bytes: the host runs it as one bash "
                        f"argument, at most {MAX_ARG_STRLEN - SCRIPT_OWN - 1} bytes",
                        "put the long part in a script file inside the job directory and run that")
