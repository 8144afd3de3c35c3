"""The agent's installable package, uploaded by `up` to tpuctl/agent/tpuctl-VERSION.tar.gz in the store, so every
host runs the same tpuctl as the CLI that made the cluster (the startup script pip-installs it from there).

It is a source distribution built from this very installation: the tpuctl package plus a minimal pyproject whose
only dependency is what the agent needs on a host (google-cloud-storage), not the CLI's typer/rich/compute.
"""
from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

from . import __version__

_PYPROJECT = f"""[build-system]
requires = ["hatchling>=1.18"]
build-backend = "hatchling.build"

[project]
name = "tpuctl"
version = "{__version__}"
requires-python = ">=3.8"
dependencies = ["google-cloud-storage>=2.14"]

[tool.hatch.build.targets.wheel]
packages = ["tpuctl"]
"""


def key() -> str:
    return f"tpuctl/agent/tpuctl-{__version__}.tar.gz"


def build() -> bytes:
    src = Path(__file__).parent
    top = f"tpuctl-{__version__}"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        add("pyproject.toml", _PYPROJECT.encode())
        add("PKG-INFO", f"Metadata-Version: 2.1\nName: tpuctl\nVersion: {__version__}\n".encode())
        for path in sorted(src.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                add("tpuctl/" + path.relative_to(src).as_posix(), path.read_bytes())
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as g:
        g.write(raw.getvalue())
    return gz.getvalue()
