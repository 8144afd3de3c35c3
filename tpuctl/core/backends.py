"""Which backend a Keras 3 job (`framework = "keras"`) runs on, picked from where it runs; docs/backends.md.

TensorFlow only where TensorFlow drives the TPU: a TPU VM made on a TensorFlow runtime (tpu-vm-tf-*: TensorFlow
and libtpu matched by Google) and the VM beside a legacy TPU Node. JAX everywhere the image's own stack is JAX:
Kaggle's TPU image ships JAX with libtpu and only tensorflow-cpu (Kaggle/docker-python tpu/requirements.in:
`jax[tpu]`, `keras>3`, "TODO: b/447621961 - re-enable tensorflow-tpu when a compatible libtpu can be found"),
Colab's TPU runtimes have no TensorFlow (googlecolab/colabtools#5174), base runtimes (every v5e/v5p/v6e, and each
`up --framework jax`) have no framework at all and Google installs JAX on them (`pip install -U "jax[tpu]"`),
Multislice is a JAX-first design (TPUStrategy does not span slices), and GPUs. On this machine (the local
provider): TensorFlow when it imports, else JAX. A job or user forces it: `[env] KERAS_BACKEND` or tpuctl.toml's
`keras_backend`.

Keras 3 runs on TensorFlow 2.16.1 and later only (keras-team/keras README, "Backend Compatibility Table"). The reports
of Keras 3 under TPUStrategy failing on TPU VMs are below that or on a misplaced libtpu: keras-team/keras#19448 and
Kaggle/docker-python#1370 are TensorFlow 2.15 with Keras 3.0.5, and Kaggle's own TPU VM image then ran Keras 3 on
TensorFlow 2.16 once its libtpu path was right (Kaggle/docker-python#1390: "The libtpu location changed in tf2.16,
that's what was missing"; host/tpuenv.py finds the libtpu Python imports). So an older TensorFlow runtime runs a
Keras 3 job on JAX, and a Node (which cannot run JAX) with an older TensorFlow is refused at submit."""
from __future__ import annotations

import re
from typing import Any, Mapping, MutableMapping, Optional

from .errors import bad_input

BACKENDS = ("jax", "tensorflow")
ENV = "KERAS_BACKEND"   # what Keras 3 reads at import (keras/src/backend/config.py: os.environ["KERAS_BACKEND"])


def keep_keras_3(env: MutableMapping[str, str], job_env: Mapping[str, str]) -> None:
    """A Keras 3 job's environment holds no TF_USE_LEGACY_KERAS it did not ask for: one inherited from the shell, the
    image or the agent's own process (TPU VM images and tf-keras setups export it) turns `tf.keras` into tf-keras, and
    tpuctl.runtime then builds the job's schedule from tf-keras's classes, which Keras 3's optimizer calls wrongly
    (`WarmupDecay.__call__() missing 1 required positional argument: 'step'`, as a suite run showed)."""
    if "TF_USE_LEGACY_KERAS" not in job_env:
        env.pop("TF_USE_LEGACY_KERAS", None)


def is_tpu_type(accelerator_type: str) -> bool:
    """Whether an accelerator type names a Cloud TPU (v2-8, v5litepod-4, v6e-16, tpu7x-16; what a host's
    TPUCTL_ACCELERATOR carries) rather than GPUs ("gpu:..."), a Kaggle accelerator or nothing. TPU7x broke the old
    rule that every TPU type starts with "v"."""
    return bool(re.match(r"^(v\d+[a-z]*|tpu\d+[a-z]*)-\d+$", accelerator_type or ""))


KERAS_MIN_TENSORFLOW = (2, 16, 1)
_MIN = ".".join(map(str, KERAS_MIN_TENSORFLOW))


def too_old_for_keras_3(record: Mapping[str, Any]) -> str:
    """The TensorFlow version ("2.15.0") a TPU VM's tpu-vm-tf-X.Y.Z runtime or a legacy Node's version (X.Y.Z)
    carries, when it is below Keras 3's minimum; else "" (a newer one, or a runtime that names none)."""
    prefix = "" if record.get("arch") == "node" else "tpu-vm-tf-"   # a Node's version is TensorFlow's own
    m = re.match(rf"^{prefix}(\d+)\.(\d+)\.(\d+)", str(record.get("runtime") or ""))
    version = tuple(int(g) for g in m.groups()) if m else None
    return ".".join(map(str, version)) if version and version < KERAS_MIN_TENSORFLOW else ""


def old_tensorflow_refusal(record: Mapping[str, Any], forced_backend: str) -> Optional[tuple[str, str]]:
    """(why, hint) when a Keras 3 job would run on a TensorFlow older than Keras 3 supports: beside a Node (which runs
    nothing but TensorFlow), or forced onto TensorFlow on an older tpu-vm-tf runtime; else None."""
    old = too_old_for_keras_3(record)
    if old and record.get("arch") == "node":
        return (f"a Keras 3 job (framework = \"keras\") needs TensorFlow {_MIN} or later, and the TPU Node runs "
                f"TensorFlow {old}", "use a TPU VM cluster (`tpuctl up` without --arch node): it runs the job on JAX")
    if old and forced_backend == "tensorflow":
        return (f"the job forces Keras's TensorFlow backend, and the runtime {record.get('runtime')} carries "
                f"TensorFlow {old}: Keras 3 needs {_MIN} or later",
                "let tpuctl pick the backend (JAX there): remove keras_backend / [env] KERAS_BACKEND")
    return None


def check_forced(where: str, value: str) -> None:
    """A backend a job forces is one of BACKENDS, spelled as Keras reads it: Keras takes KERAS_BACKEND as written
    (keras/src/backend/config.py: `_backend = os.environ["KERAS_BACKEND"]; if _backend: _BACKEND = _backend`), so
    "JAX" or " jax" fail on the host at import ("Unable to import backend"), and an empty value is ignored: Keras
    falls back to its default, TensorFlow, whatever tpuctl picked (issue 52.7). "torch" and "numpy" are Keras
    backends, but none tpuctl runs on a TPU."""
    if value in BACKENDS:
        return
    known = value.strip().lower()
    if not value:
        why = "is empty: Keras ignores it and falls back to TensorFlow, whatever tpuctl picks"
    elif known in BACKENDS:
        why = f"is not spelled as Keras reads it (it takes {known!r} exactly)"
    else:
        why = f"is not a backend tpuctl runs ({' or '.join(BACKENDS)})"
    raise bad_input(f"{where} {value!r} {why}",
                    f'give "{known}"' if known in BACKENDS else
                    'give "jax" or "tensorflow", or remove it: tpuctl picks the backend from where the job runs')


def forced(env: Mapping[str, str], keras_backend: str) -> tuple[str, str]:
    """(the backend the job or user asked for, where it was asked), or ("", "") when tpuctl picks. An empty [env]
    KERAS_BACKEND (which submit refuses; a job written before it did) is what Keras makes of it: TensorFlow."""
    if ENV in env:
        return (env[ENV], f"[env] {ENV}") if env[ENV] else \
            ("tensorflow", f"an empty [env] {ENV}, which Keras ignores for its default")
    if keras_backend:
        return keras_backend, "keras_backend in tpuctl.toml"
    return "", ""


def tensorflow_runtime(record: Mapping[str, Any]) -> bool:
    """Whether a TPU VM was made on a runtime that carries TensorFlow (providers/gcp/tpuapi/tpu.py tensorflow_from)."""
    return record.get("tensorflow_from") == "image" or str(record.get("runtime") or "").startswith("tpu-vm-tf")


def for_host(record: Mapping[str, Any], accelerator: str, tensorflow_imports: bool) -> tuple[str, str]:
    """(backend, why) for an agent's host: a TPU VM or a legacy Node's VM (the cluster record says which), GPUs,
    or this machine (`tensorflow_imports`: whether the agent's interpreter finds TensorFlow)."""
    runtime = str(record.get("runtime") or "")
    if record.get("arch") == "node":
        return "tensorflow", "beside a legacy TPU Node, TensorFlow drives the TPU"
    if accelerator.startswith("gpu"):
        return "jax", "on GPUs, Keras 3's JAX backend"
    if record.get("arch") == "vm" and is_tpu_type(accelerator):
        if int(record.get("slices") or 1) > 1:
            return "jax", "a Multislice cluster: TPUStrategy does not span slices"
        if tensorflow_runtime(record):
            old = too_old_for_keras_3(record)
            if old:
                return "jax", f"the runtime {runtime}'s TensorFlow {old} predates Keras 3, which needs {_MIN}"
            return "tensorflow", f"a TPU VM on the TensorFlow runtime {runtime}"
        return "jax", f"a TPU VM on the base runtime {runtime or '(unknown)'}, which carries no TensorFlow"
    if tensorflow_imports:
        return "tensorflow", "TensorFlow is installed on this machine"
    return "jax", "no TensorFlow on this machine"


def for_session(platform: str, accelerator: str, tensorflow_imports: bool) -> tuple[str, str]:
    """(backend, why) in a Kaggle session (`platform` "kaggle") or a notebook (host/session.py): JAX, the images'
    own stack, on Kaggle and on Colab's TPU; a plain Jupyter with no TPU is this machine."""
    if platform == "kaggle" and accelerator.startswith("kaggle:Tpu"):
        return "jax", "Kaggle's TPU image drives the TPU with JAX and libtpu, and has no TPU TensorFlow"
    if platform == "kaggle":   # its GPU and CPU images: JAX as on its TPU, one job the same everywhere on Kaggle
        return "jax", "on GPUs, Keras 3's JAX backend" if accelerator.startswith("gpu") else "on Kaggle, as on its TPU"
    if is_tpu_type(accelerator):
        return "jax", "Colab's TPU runtimes have JAX and no TensorFlow"
    return for_host({}, accelerator, tensorflow_imports)


def program_framework(framework: str, env: Mapping[str, str], keras_backend: str, record: Mapping[str, Any]) -> str:
    """The framework whose slice rules a run keeps (TensorFlow: worker 0 runs it; any other: every host), as the
    control side works it out from the cluster record: a Keras job's backend's on a TPU slice, as its hosts pick it
    from the same record (host/kerasbackend.py). Only a TPU slice has more than one host."""
    if framework != "keras":
        return framework
    name = forced(env, keras_backend)[0] or for_host(record, "v2-8", False)[0]
    return "tensorflow" if name == "tensorflow" else "jax"


def line(backend: str, why: str) -> str:
    """The log's line that says which backend runs the job, and why (among its first lines)."""
    return f"tpuctl: keras backend {backend} ({why})"
