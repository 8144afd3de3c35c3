"""The environment a framework needs on a TPU VM, as Google's own TPU harness sets it."""
from __future__ import annotations

from typing import Any


def tpu_environment(framework: str, record: dict[str, Any], accelerator: str, libtpu: str = "") -> dict[str, str]:
    """What a framework needs on a TPU VM, as Google's TPU harness exports it (GoogleCloudPlatform/ml-auto-solutions,
    `export_env_variable(is_pod, is_pjrt)`): TensorFlow on a multi-host slice: TPU_NAME=<node> and
    TPU_LOAD_LIBRARY=0 (worker 0 drives the slice, every host serves the runtime); TensorFlow on a single-host PJRT
    runtime: NEXT_PLUGGABLE_DEVICE_USE_C_API=true and TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so.
    Where the host pip-installed tensorflow-tpu (a base runtime), the same PJRT pair, with the library that came
    with it (`libtpu`; the harness points at the pip-installed libtpu/libtpu.so). PyTorch/XLA: PJRT_DEVICE=TPU.
    Nothing off a TPU VM (the local provider, the legacy node's VM)."""
    if record.get("arch") != "vm" or not accelerator.startswith("v"):
        return {}
    if framework == "pytorch":
        return {"PJRT_DEVICE": "TPU"}
    if framework != "tensorflow":
        return {}
    if int(record.get("hosts") or 1) > 1:
        return {"TPU_NAME": str(record.get("tpu_name", "")), "TPU_LOAD_LIBRARY": "0"}
    if libtpu:
        return {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": libtpu}
    if "pjrt" in str(record.get("runtime", "")):
        return {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so"}
    return {}
