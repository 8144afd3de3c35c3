"""The job's small text files (metrics.json): written whole, to a local path, the cluster's store (tpuctl's own client,
no TensorFlow) or any other URL (TensorFlow's file system); only the first host of a run writes metrics."""
from __future__ import annotations

import os
from typing import Any

from .keras_env import tf_module


def records_metrics() -> bool:
    """Only the first host of a run across hosts writes metrics.json: every host runs the same steps of one
    program, and goodput counts the run's starts once, as for one slice (N writers would interleave N histories)."""
    return os.environ.get("TPUCTL_WORKER", "0") in ("", "0")


def write_text(target: str, text: str, tf: Any = None) -> None:
    """Replace `target` whole: a local file by rename (readers never see half of one); in the cluster's store
    through tpuctl's own store client (no TensorFlow needed); elsewhere through TensorFlow's file system."""
    store = os.environ.get("TPUCTL_STORE", "").rstrip("/")
    if "://" in target and store and target.startswith(store + "/"):
        from ..providers.stores import open_store
        open_store(store).write(target[len(store) + 1:], text.encode())
        return
    if "://" in target:
        tf = tf or tf_module()
        with tf.io.gfile.GFile(target, "w") as f:
            f.write(text)
        return
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    tmp = f"{target}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, target)


def read_bytes(target: str) -> bytes | None:
    store = os.environ.get("TPUCTL_STORE", "").rstrip("/")
    if "://" in target and store and target.startswith(store + "/"):
        from ..providers.stores import open_store
        return open_store(store).read(target[len(store) + 1:])
    if "://" in target:
        gfile = tf_module().io.gfile
        if not gfile.exists(target):
            return None
        with gfile.GFile(target, "rb") as f:
            return bytes(f.read())
    try:
        with open(target, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
