"""What a run on GKE can be: JAX or PyTorch, or Keras 3 on JAX; never TensorFlow (issue 49 item 3).

Why TensorFlow is refused, before anything is made:
- nothing in the pod installs it: the default image (manifest.DEFAULT_IMAGE) has python and pip only, and on a TPU
  VM it is the host's runtime image or tpuctl's own install for a base runtime (host/jobenv.py, host/podruntime.py)
  that brings TensorFlow's libtpu, which no GKE node has;
- TensorFlow's TPUStrategy reaches a slice through TPU_NAME, a Cloud TPU node; on GKE the TPU hosts are node-pool
  VMs with no Cloud TPU node to name (GKE_FACTS.md);
- GKE's Multislice guide lists JAX and PyTorch only (kubernetes-engine/docs/how-to/tpu-multislice).
A Keras 3 job runs on JAX there (core/backends.py picks JAX where the host has no TensorFlow), unless it forces the
TensorFlow backend, which is refused the same way."""
from __future__ import annotations

from typing import Mapping

from ...core import backends
from ...core.errors import bad_input
from ...core.models import Framework

WHY = ("TensorFlow does not run on GKE: no GKE node or image carries a TPU TensorFlow, TPUStrategy needs a Cloud TPU "
       "node (TPU_NAME) that GKE does not have, and GKE's TPU guides cover JAX and PyTorch only")
POD_RUNS = "JAX (a Keras 3 job: Keras's JAX backend), installed in the pod from the job's requirements"


def check_job(name: str, framework: Framework, env: Mapping[str, str], keras_backend: str) -> None:
    """`submit` and `submit --dry-run --provider gke`: a TensorFlow job, or a Keras job forcing TensorFlow, refused."""
    if framework is Framework.TENSORFLOW:
        raise bad_input(f'job {name} is TensorFlow (framework = "tensorflow", what tpuctl.toml means when it names '
                        f"no framework): {WHY}",
                        'set framework = "jax" or "pytorch" in tpuctl.toml, or "keras" for a Keras 3 job (JAX on '
                        "GKE); or run it with --provider gcp")
    forced, where = backends.forced(env, keras_backend)
    if framework is Framework.KERAS and forced == "tensorflow":
        raise bad_input(f"job {name} forces Keras's TensorFlow backend ({where}): {WHY}",
                        "let tpuctl pick the backend (JAX on GKE): remove keras_backend / [env] KERAS_BACKEND")


def check_cluster(framework: str | None) -> Framework:
    """`up --provider gke --framework F`: JAX by default; TensorFlow refused; PyTorch as asked."""
    try:
        fw = Framework(framework or Framework.JAX.value)
    except ValueError:
        fw = None
    if fw is Framework.TENSORFLOW:
        raise bad_input(f"--framework tensorflow: {WHY}", "use --framework jax (the default on GKE) or pytorch")
    if fw is None or fw is Framework.KERAS:   # a job's framework, never a cluster's (core/backends.py)
        raise bad_input(f"unknown --framework {framework!r}", "use jax (default on GKE) or pytorch (a Keras 3 job "
                        "runs on JAX there)")
    return fw
