"""A job's requirements in an environment of their own, on the host as on this machine. It is a venv made from the
agent's interpreter, without pip, whose site-packages first hold what the requirements install and then, through
a .pth file, the agent's own site directories: the job sees the host's TensorFlow stack (and tpuctl.runtime, and
pip itself) without reinstalling it, and pip never changes the agent's environment (a version the job pins that
differs from the agent's is installed into the job's venv: pip does not uninstall what lies outside the
environment it installs into). The image's TensorFlow stack stays pinned by the constraints file.

On a TPU VM made on a base runtime the host has no TensorFlow of its own: the environment then first gets the
TensorFlow the job asked for, the way Google's own TF release tests install it (GoogleCloudPlatform/ml-auto-solutions,
dags/solutions_team/configs/tensorflow/common.py): `pip install tensorflow-tpu==X -f
https://storage.googleapis.com/libtpu-tf-releases/index.html` (install_tf) and tf-keras with `--no-deps`
(set_up_tensorflow_models). --no-deps matters: tf-keras requires `tensorflow` by that name (2.20.1: tensorflow>=2.20,
<2.21), and beside a tensorflow-tpu distribution pip would fetch PyPI's `tensorflow` as a second copy.

Where a Keras 3 job runs on JAX on a TPU VM whose image has no JAX (a base runtime), the environment first gets
`jax[tpu]`, as JAX's own install instructions put it for Google TPUs (`pip install -U "jax[tpu]"`: the jax README's
"Installation" table, in jax 0.10.2's PyPI METADATA; its `tpu` extra requires `libtpu==0.0.42.*` from PyPI, so no
find-links page is needed any more).

Environments are cached by a hash of the interpreter, the requirements, the constraints (the TensorFlow asked
for) and the JAX asked for, and marked complete only after pip succeeded, so a re-run (and a rebooted host: the
cache is on its disk) installs nothing and an install cut short is redone."""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import sys
from pathlib import Path

READY = ".tpuctl-ready"
PINNED = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-keras", "keras", "libtpu", "libtpu-nightly",
          "tensorboard", "tf-nightly")
FIND_LINKS = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
JAX_TPU = "jax[tpu]"
# The library of the libtpu Python finds, whichever distribution provided it: the job's environment's, or one the
# image installed outside it (Kaggle's TPU image: libtpu 0.0.17 system-wide, which satisfies tensorflow-tpu's
# `libtpu~=0.0.14`, so pip installs none into the environment). libtpu's own answer first (libtpu/__init__.py:
# `get_library_path()` is `os.path.join(os.path.dirname(__file__), 'libtpu.so')`, libtpu 0.0.42.1), else the same
# path beside the module found. Prints nothing and exits 1 when no libtpu is importable.
FIND_LIBTPU = """import importlib.util, os, sys
spec = importlib.util.find_spec("libtpu")
if spec is None or not spec.origin:
    sys.exit(1)
try:
    import libtpu
    path = libtpu.get_library_path()
except Exception:
    path = os.path.join(os.path.dirname(spec.origin), "libtpu.so")
print(path)
"""


def find_links() -> str:
    """Where tensorflow-tpu wheels are found (TPUCTL_TF_FIND_LINKS: a mirror, or the tests' local index)."""
    return os.environ.get("TPUCTL_TF_FIND_LINKS") or FIND_LINKS


def tensorflow_pins(version: str) -> list[str]:
    """The requirement lines for TensorFlow `version` (a major.minor line, or an exact release) and its tf-keras."""
    line = ".".join(version.split(".")[:2])
    tf = f"tensorflow-tpu=={version}" if version.count(".") == 2 else f"tensorflow-tpu~={line}.0"
    return [tf, f"tf-keras~={line}.0"]


def write_constraints(path: Path, tensorflow: str = "") -> Path:
    """Pins of the TensorFlow stack, so a job's requirements can add packages but never swap TF: the image's, or,
    where TensorFlow is installed for the job (`tensorflow`), the version installed."""
    from importlib import metadata
    pins = sorted({f"{d.metadata['Name'].lower()}=={d.version}" for d in metadata.distributions()
                   if (d.metadata["Name"] or "").lower() in PINNED}) if not tensorflow else tensorflow_pins(tensorflow)
    path.write_text("\n".join(pins) + "\n")
    return path


def without_provided(requirements: Path, dest: Path) -> list[str]:
    """The job's requirements less the TensorFlow stack installed for it, written to `dest`; returns the names left
    out. Needed where TensorFlow is installed as tensorflow-tpu: a line such as `tf-keras` would otherwise make pip
    resolve tf-keras's own `Requires-Dist: tensorflow` and fetch PyPI's tensorflow into the same `tensorflow/`
    folder (the constraints pin tensorflow-tpu, a different name, so they cannot stop it)."""
    kept, dropped = [], []
    for line in requirements.read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
        name = m.group(1).lower().replace("_", "-") if m and not line.lstrip().startswith("-") else ""
        if name in PINNED:
            dropped.append(name)
            line = f"# provided with TensorFlow: {line}"
        kept.append(line)
    dest.write_text("\n".join(kept) + "\n")
    return dropped


def plan(home: Path, code: Path, requirements: str, work: Path, tensorflow: str = "", jax: str = "",
         libtpu: bool = False) -> tuple[Path, str]:
    """(the job's environment, the bash that makes it and puts it first on PATH): TensorFlow `tensorflow` first
    where asked (then the requirements less its stack: without_provided), or JAX `jax` (JAX_TPU), the requirements
    constrained (`work` holds the constraints and the filtered requirements). `libtpu`: then point TensorFlow's
    pluggable device at the libtpu that Python finds there (FIND_LIBTPU)."""
    cons = write_constraints(work / "constraints.txt", tensorflow)
    req = code / requirements if requirements else None
    note = ""
    if req and tensorflow and req.is_file():
        dropped = without_provided(req, work / "requirements.txt")
        req = work / "requirements.txt"
        if dropped:
            said = f"tpuctl: {requirements}: {', '.join(dropped)} come with the TensorFlow installed for the job"
            note = f"echo {shlex.quote(said)}\n"
    # a missing file hashes as empty; pip then says in the run's log that it is missing
    env = env_dir(home, req.read_bytes() if req and req.is_file() else b"", cons.read_bytes() + jax.encode())
    made = script(env, str(req) if req else "", cons, tensorflow, jax)
    return env, note + made + (pjrt_library() if libtpu else "")


def pjrt_library() -> str:
    """bash: TF_PLUGGABLE_DEVICE_LIBRARY_PATH set to the importable libtpu's library (FIND_LIBTPU), said in the log;
    left as it was when no libtpu is importable."""
    return (f"if _libtpu=$(python -c {shlex.quote(FIND_LIBTPU)}); then\n"
            f"  export TF_PLUGGABLE_DEVICE_LIBRARY_PATH=\"$_libtpu\"\n"
            f"  echo \"tpuctl: TensorFlow's TPU library: $_libtpu\"\n"
            f"fi\n")


def purelib(env: Path) -> Path:
    return env / f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def _site_dirs() -> list[str]:
    """The agent's site directories, in its own order (venv, then the system's when the venv sees it)."""
    return [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)]


def env_dir(home: Path, requirements: bytes, constraints: bytes) -> Path:
    h = hashlib.sha256()
    for part in (sys.executable.encode(), requirements, constraints):
        h.update(hashlib.sha256(part).digest())
    return home / "envs" / h.hexdigest()[:16]


def script(env: Path, requirements: str, constraints: Path, tensorflow: str = "", jax: str = "") -> str:
    """bash that makes (unless made) the environment, then puts its `python` first on PATH. Run in the job's
    script, so pip's output lands in the run's log. `tensorflow`: the version to install first (base runtimes);
    `jax`: the JAX requirement to install first (JAX_TPU, a base runtime with a Keras job on JAX)."""
    q = shlex.quote
    pth = "".join(f"import site; site.addsitedir({d!r})\n" for d in _site_dirs())
    # --no-compile: pip byte-compiles every module it installs, most of its time for Keras (3.1 -> 1.3 CPU-s here);
    # the job's own imports compile only the modules it uses (about half of Keras's), once, into the environment
    pip = f"{q(str(env / 'bin' / 'python'))} -m pip install -q --disable-pip-version-check --no-compile"
    steps = ""
    if tensorflow:
        tf, keras = tensorflow_pins(tensorflow)
        steps += (f"  echo 'tpuctl: installing {tf} and {keras} (--no-deps), as Google installs them on base "
                  f"runtimes'\n"
                  f"  {pip} {q(tf)} -f {q(find_links())}\n"
                  f"  {pip} --no-deps {q(keras)}\n")
    if jax:
        steps += (f"  echo 'tpuctl: installing {jax}, as JAX installs on Google TPUs (no JAX in this image)'\n"
                  f"  {pip} {q(jax)}\n")
    if requirements:
        steps += f"  {pip} -r {q(requirements)} -c {q(str(constraints))}\n"
    what = "requirements" if requirements else "TensorFlow" if tensorflow else "JAX"
    return (f"if [ ! -f {q(str(env / READY))} ]; then\n"
            f"  rm -rf {q(str(env))}\n"
            f"  {q(sys.executable)} -m venv --without-pip {q(str(env))}\n"
            f"  printf %s {q(pth)} > {q(str(purelib(env) / '_tpuctl_host.pth'))}\n"
            + steps +
            f"  touch {q(str(env / READY))}\n"
            f"else\n"
            f"  echo 'tpuctl: {what} already installed ({env.name})'\n"
            f"fi\n"
            f"export PATH={q(str(env / 'bin'))}:\"$PATH\"\n")
