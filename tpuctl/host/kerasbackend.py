"""A Keras 3 job's backend on an agent's host (core/backends.py picks it), and what follows from it: which
framework's rules the run keeps on a slice (TensorFlow: worker 0 runs the program; JAX: every worker), what the host
installs for it, and the job's environment."""
from __future__ import annotations

import importlib.util
import shlex
from typing import Any, Mapping

from ..core import backends
from ..core.backends import is_tpu_type
from ..core.jobspec import DEFAULT_TENSORFLOW
from ..core.runs import RunSpec


def pick(job: RunSpec, record: Mapping[str, Any], accelerator: str) -> tuple[str, str]:
    """(backend, why) for a Keras job; ("", "") for any other."""
    if job.framework != "keras":
        return "", ""
    name, where = backends.forced(job.env, job.keras_backend)
    if name:
        return name, f"forced by {where}"
    return backends.for_host(record, accelerator, importlib.util.find_spec("tensorflow") is not None)


def framework(job: RunSpec, record: Mapping[str, Any], accelerator: str) -> str:
    """The framework whose rules the run keeps: the job's own, or a Keras job's backend's (any backend but
    TensorFlow runs one program per host, as JAX does)."""
    if job.framework != "keras":
        return job.framework
    return "tensorflow" if pick(job, record, accelerator)[0] == "tensorflow" else "jax"


def tensorflow_to_install(job: RunSpec, record: Mapping[str, Any], accelerator: str) -> str:
    """The TensorFlow this host installs for the job: on a TPU VM whose runtime has none (the cluster record's
    `tensorflow_from` is "pip"), the version the job's tpuctl.toml asked for; else "" (the image's). A Keras job
    counts by its backend."""
    on_tf = framework(job, record, accelerator) == "tensorflow"
    return (job.tensorflow or DEFAULT_TENSORFLOW) if on_tf and record.get("tensorflow_from") == "pip" else ""


def jax_to_install(job: RunSpec, record: Mapping[str, Any], accelerator: str) -> str:
    """What a Keras job on JAX gets installed on a TPU VM whose image has no JAX (a base runtime: nothing of a
    framework, tpu.py BASE_RUNTIMES), as JAX installs on TPUs (host/jobenv.py JAX_TPU); else ""."""
    on_tpu_vm = record.get("arch") == "vm" and is_tpu_type(accelerator)
    if pick(job, record, accelerator)[0] != "jax" or not on_tpu_vm or importlib.util.find_spec("jax") is not None:
        return ""
    from .jobenv import JAX_TPU
    return JAX_TPU


def environment(job: RunSpec, record: Mapping[str, Any], accelerator: str) -> dict[str, str]:
    """KERAS_BACKEND for a Keras job (the job's own [env] value wins: it is the job's env already)."""
    backend = pick(job, record, accelerator)[0]
    return {backends.ENV: backend} if backend and backends.ENV not in job.env else {}


def said(job: RunSpec, record: Mapping[str, Any], accelerator: str) -> str:
    """bash that says a Keras job's backend and why (the first line of its log), "" for any other job."""
    backend, why = pick(job, record, accelerator)
    return f"echo {shlex.quote(backends.line(backend, why))}\n" if backend else ""
