"""Renders templates/startup.sh, the host startup script that installs and keeps the agent running."""
from __future__ import annotations

import string
from pathlib import Path

from . import __version__


class _Template(string.Template):
    delimiter = "@"   # bash owns `$`; `@{name}` never appears in the script otherwise


def templates_dir() -> Path:
    packaged = Path(__file__).parent / "templates"   # inside the wheel
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "templates"   # source checkout


def render(store: str, cluster: str, role: str, accelerator: str, tpu_address: str = "", tf_version: str = "") -> str:
    if role not in ("tpu-vm", "node-vm"):
        raise ValueError(role)
    text = (templates_dir() / "startup.sh").read_text()
    return _Template(text).substitute(store=store, cluster=cluster, version=__version__, role=role,
                                      accelerator=accelerator, tpu_address=tpu_address, tf_version=tf_version)
