"""The environment a framework needs on a TPU VM, as Google's own TPU harness sets it."""
from __future__ import annotations

from typing import Any

from ..core.backends import is_tpu_type


def pjrt_from_python(tensorflow: str, record: dict[str, Any], job_env: dict[str, str]) -> bool:
    """Whether the host points TF_PLUGGABLE_DEVICE_LIBRARY_PATH at the libtpu Python finds in the job's environment
    (jobenv.pjrt_library): where it installed TensorFlow (`tensorflow`) on one host (a slice's TensorFlow leaves
    libtpu to the TPU runtime service), unless the job sets the path itself."""
    return bool(tensorflow) and int(record.get("hosts") or 1) == 1 and "TF_PLUGGABLE_DEVICE_LIBRARY_PATH" not in job_env


def tpu_environment(framework: str, record: dict[str, Any], accelerator: str, libtpu: str = "") -> dict[str, str]:
    """What a framework needs on a TPU VM, as Google's TPU harness exports it (GoogleCloudPlatform/ml-auto-solutions,
    dags/solutions_team/configs/tensorflow/common.py `export_env_variables`). TensorFlow, always:
    WRAPT_DISABLE_EXTENSIONS=true and TPU_NAME (the node's name on a multi-host slice, "local" on one host: the
    harness's `tpu_name = ... if is_pod else "local"`); on a multi-host slice TPU_LOAD_LIBRARY=0 (worker 0 drives the
    slice, every host serves the runtime); on a single-host PJRT runtime NEXT_PLUGGABLE_DEVICE_USE_C_API=true and
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so. Where the host pip-installed tensorflow-tpu (a base runtime), the
    same PJRT pair, with the library that came with it (`libtpu`; the harness points at the pip-installed
    libtpu/libtpu.so). PyTorch/XLA: PJRT_DEVICE=TPU. Nothing off a TPU VM (the local provider, the legacy node's
    VM)."""
    if record.get("arch") != "vm" or not is_tpu_type(accelerator):
        return {}
    if framework == "pytorch":
        return {"PJRT_DEVICE": "TPU"}
    if framework != "tensorflow":
        return {}
    env = {"WRAPT_DISABLE_EXTENSIONS": "true"}
    if int(record.get("hosts") or 1) > 1:
        return {**env, "TPU_NAME": str(record.get("tpu_name", "")), "TPU_LOAD_LIBRARY": "0"}
    env["TPU_NAME"] = "local"
    if libtpu:
        return {**env, "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": libtpu}
    if "pjrt" in str(record.get("runtime", "")):
        return {**env, "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so"}
    return env
