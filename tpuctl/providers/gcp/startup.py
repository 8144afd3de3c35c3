"""Renders templates/startup.sh, the host start-up script that installs and keeps the agent running. Store keys
come from layout.py, so the script and the CLI agree on where the agent package and boot logs live."""
from __future__ import annotations

import string
from pathlib import Path

from ... import __version__
from ...core import layout
from ..google.gcs_store import SATISFIED, STORAGE


class _Template(string.Template):
    delimiter = "@"   # bash owns `$`; `@{name}` never appears in the script otherwise


def templates_dir() -> Path:
    top = Path(__file__).parents[2]                  # the tpuctl package
    packaged = top / "templates"                     # inside the wheel
    return packaged if packaged.is_dir() else top.parent / "templates"   # source checkout


def render(store: str, cluster: str, role: str, accelerator: str, tpu_address: str = "", tf_version: str = "") -> str:
    """role: "tpu-vm" (the TPU host itself), "node-vm" (the VM beside a legacy TPU Node) or "watcher-vm" (the
    recovery watcher's VM: it installs the watcher package and runs `tpuctl.watcher` instead of the agent)."""
    if role not in ("tpu-vm", "node-vm", "watcher-vm"):
        raise ValueError(role)
    package = layout.watcher_package(__version__) if role == "watcher-vm" else layout.agent_package(__version__)
    text = (templates_dir() / "startup.sh").read_text()
    return _Template(text).substitute(store=store, cluster=cluster, version=__version__, role=role,
                                      accelerator=accelerator, tpu_address=tpu_address, tf_version=tf_version,
                                      agent_package=package, storage_req=STORAGE, satisfied=SATISFIED,
                                      boot_prefix=layout.BOOT_PREFIX)
