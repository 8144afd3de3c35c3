"""A job's requirements in an environment of their own, on the host as on this machine. It is a venv made from the
agent's interpreter, without pip, whose site-packages first hold what the requirements install and then, through
a .pth file, the agent's own site directories: the job sees the host's TensorFlow stack (and tpuctl.runtime, and
pip itself) without reinstalling it, and pip never changes the agent's environment (a version the job pins that
differs from the agent's is installed into the job's venv: pip does not uninstall what lies outside the
environment it installs into). The image's TensorFlow stack stays pinned by the constraints file.

Environments are cached by a hash of the interpreter, the requirements and the constraints, and marked complete
only after pip succeeded, so a re-run installs nothing and an install cut short is redone."""
from __future__ import annotations

import hashlib
import os
import shlex
import sys
from pathlib import Path

READY = ".tpuctl-ready"


def _site_dirs() -> list[str]:
    """The agent's site directories, in its own order (venv, then the system's when the venv sees it)."""
    return [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)]


def env_dir(home: Path, requirements: bytes, constraints: bytes) -> Path:
    h = hashlib.sha256()
    for part in (sys.executable.encode(), requirements, constraints):
        h.update(hashlib.sha256(part).digest())
    return home / "envs" / h.hexdigest()[:16]


def script(env: Path, requirements: str, constraints: Path) -> str:
    """bash that makes (unless made) the environment, then puts its `python` first on PATH. Run in the job's
    script, so pip's output lands in the run's log."""
    q = shlex.quote
    purelib = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    pth = "".join(f"import site; site.addsitedir({d!r})\n" for d in _site_dirs())
    return (f"if [ ! -f {q(str(env / READY))} ]; then\n"
            f"  rm -rf {q(str(env))}\n"
            f"  {q(sys.executable)} -m venv --without-pip {q(str(env))}\n"
            f"  printf %s {q(pth)} > {q(str(env / purelib / '_tpuctl_host.pth'))}\n"
            f"  {q(str(env / 'bin' / 'python'))} -m pip install -q --disable-pip-version-check "
            f"-r {q(requirements)} -c {q(str(constraints))}\n"
            f"  touch {q(str(env / READY))}\n"
            f"else\n"
            f"  echo 'tpuctl: requirements already installed ({env.name})'\n"
            f"fi\n"
            f"export PATH={q(str(env / 'bin'))}:\"$PATH\"\n")
