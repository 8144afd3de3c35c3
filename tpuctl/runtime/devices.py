"""Where the job computes and how it spreads: the TPU it finds, TensorFlow's strategy or Keras's JAX distribution
(across hosts too), replicas and global batch, and the mixed precision the devices suit."""
from __future__ import annotations

import os
from typing import Any, Mapping

from .keras_env import backend, keras_module, require_keras, tf_module, version_tuple


def tpu_target(environ: Mapping[str, str] = os.environ) -> tuple[str, bool] | None:
    """Where this process finds its TPU: (argument for TPUClusterResolver, connect to a remote cluster first?), or
    None without one. In order:
    - TPUCTL_TPU, set by the agent: "local" on a TPU VM host; grpc://IP:8470 beside a legacy TPU Node; the node's
      name on worker 0 of a multi-host slice (with TPU_LOAD_LIBRARY=0, as Google's TPU harness runs TF pods);
    - TPU_NAME: a slice's worker 0 set up by hand, or a notebook that names its TPU (Kaggle's TPU Nodes did);
    - COLAB_TPU_ADDR: a Colab TPU Node; the resolver with no argument reads it itself;
    - a TPU device on this machine (/dev/accel0, /dev/vfio/0: TPU VMs, Kaggle and Colab TPU VMs): "local".
    A bare node name beside a legacy node would make TF call the retired v1 discovery API, hence grpc:// there."""
    addr = environ.get("TPUCTL_TPU", "")
    if addr:
        return addr, addr != "local"
    if environ.get("TPU_NAME"):
        return environ["TPU_NAME"], environ["TPU_NAME"] != "local"
    if environ.get("COLAB_TPU_ADDR"):
        return "", True
    from ..core.backends import is_tpu_type
    if is_tpu_type(environ.get("TPUCTL_ACCELERATOR", "")) or os.path.exists("/dev/accel0") \
            or os.path.exists("/dev/vfio/0"):
        return "local", False
    return None


class Replicas:
    """A job's distribution on a backend other than TensorFlow, with the part of tf.distribute.Strategy's surface
    a job uses: num_replicas_in_sync, scope(), and the platform of its devices ("tpu", "gpu", "cpu"). Across hosts,
    `process_index` of `process_count`: each process feeds its own `1/process_count` of every global batch, and
    reads data no other process reads."""

    def __init__(self, devices: list[Any], platform: str, distribution: Any = None, process_index: int = 0,
                 process_count: int = 1) -> None:
        self.devices, self.platform, self.distribution = devices, platform, distribution
        self.num_replicas_in_sync = len(devices)
        self.process_index, self.process_count = process_index, process_count

    def scope(self) -> Any:
        from contextlib import nullcontext
        return self.distribution.scope() if self.distribution is not None else nullcontext()


def jax_replicas(environ: Mapping[str, str] = os.environ) -> Replicas:
    """keras.distribution.DataParallel over every device (one per TPU core or GPU), set as Keras's global
    distribution, so model.fit splits each global batch across them (keras.io "Distributed training with Keras 3");
    one device runs without one. A run across hosts (TPUCTL_NUM_WORKERS > 1) first calls
    jax.distributed.initialize(), which finds the other hosts from the TPU's own metadata (JAX "Multi-host and
    multi-process environments"), or, where JAX_COORDINATOR_ADDRESS is set (off a TPU: GPUs, CPUs, a test), from it
    with TPUCTL_NUM_WORKERS and TPUCTL_WORKER as the process count and index; after which
    keras.distribution.list_devices() names every host's devices.

    Across hosts each process feeds its own part of the batch: DataParallel(auto_shard_dataset=False). With
    auto-sharding on, Keras refuses anything but a tf.data.Dataset under a multi-process distribution
    (keras/src/trainers/data_adapters/__init__.py: "When using a multi-worker distribution with auto-sharding
    enabled, the data must be provided as a tf.data.Dataset instance"); with it off, each process's batch becomes
    its slice of the global one (keras/src/backend/jax/distribution_lib.py distribute_data_input:
    jax.make_array_from_process_local_data). Keras accepts data other than tf.data there from keras-team/keras#21430
    (merged 2025-06-30, released in 3.11)."""
    import jax
    import keras
    workers = int(environ.get("TPUCTL_NUM_WORKERS") or 1)
    if workers > 1:
        require_keras("3.11", "a JAX run across hosts (DataParallel(auto_shard_dataset=False))")
        given: dict[str, Any] = {"num_processes": workers, "process_id": int(environ.get("TPUCTL_WORKER") or 0)} \
            if environ.get("JAX_COORDINATOR_ADDRESS") else {}
        # before anything touches a device (jax.process_count() would start the backend, after which initialize()
        # refuses); a second call in one process raises RuntimeError ("should only be called once")
        try:
            jax.distributed.initialize(**given)
        except RuntimeError as e:
            if "once" not in str(e):
                raise
        except ValueError:
            # no cluster JAX knows (a Compute Engine TPU VM may lack the metadata JAX's detection needs): the
            # agent's TPUCTL_JAX_* say where the coordinator is and which process this is (host/jaxcluster.py)
            if not environ.get("TPUCTL_JAX_COORDINATOR"):
                raise
            jax.distributed.initialize(coordinator_address=environ["TPUCTL_JAX_COORDINATOR"],
                                       num_processes=int(environ["TPUCTL_JAX_NUM_PROCESSES"]),
                                       process_id=int(environ["TPUCTL_JAX_PROCESS_ID"]))
    devices = keras.distribution.list_devices()
    platform = jax.devices()[0].platform
    processes = jax.process_count()
    dist = None
    if len(devices) > 1:
        dist = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False) if processes > 1 else \
            keras.distribution.DataParallel(devices=devices)
        keras.distribution.set_distribution(dist)
    return Replicas(devices, "gpu" if platform in ("gpu", "cuda", "rocm") else platform, dist,
                    jax.process_index(), processes)


def strategy(tpu: str | None = "auto") -> Any:
    """TensorFlow backend: TPUStrategy on a TPU; MirroredStrategy over several GPUs; else the default strategy (one
    GPU or the CPU). `tpu`: "auto" (tpu_target), a resolver argument, or None for no TPU. GPU memory growth is
    turned on first, so a job does not grab the whole card. JAX backend: jax_replicas()."""
    if backend() == "jax":
        return jax_replicas()
    tf = tf_module()
    target = tpu_target() if tpu == "auto" else ((tpu, tpu != "local") if tpu else None)
    if target:
        arg, connect = target
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=arg) if arg else \
            tf.distribute.cluster_resolver.TPUClusterResolver()
        if connect:
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    gpus = tf.config.list_physical_devices("GPU")
    for g in gpus:
        try:
            tf.config.experimental.set_memory_growth(g, True)
        except RuntimeError:
            pass  # already initialised: growth can only be set before first use
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def kind(strategy_: Any) -> str:
    """'tpu', 'gpu' or 'cpu': what the strategy runs on (decides mixed precision)."""
    if isinstance(strategy_, Replicas):
        return strategy_.platform
    tf = tf_module()
    if isinstance(strategy_, tf.distribute.TPUStrategy):
        return "tpu"
    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def global_batch(per_replica: int, strategy_: Any) -> int:
    return per_replica * strategy_.num_replicas_in_sync


def gpu_has_bfloat16() -> bool:
    """Whether this process's (first) GPU computes in bfloat16 natively: NVIDIA compute capability 8.0 or later
    (Ampere on: A100, L4, H100, H200; CUDA C++ Programming Guide, "Arithmetic Instructions"). JAX names it
    `device.compute_capability` ("9.0"), TensorFlow `get_device_details(gpu)["compute_capability"]` ((9, 0))."""
    if backend() == "jax":
        import jax
        return version_tuple(str(getattr(jax.devices()[0], "compute_capability", "") or "")) >= (8,)
    tf = tf_module()
    gpus = tf.config.list_physical_devices("GPU")
    details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
    return tuple(details.get("compute_capability") or ()) >= (8, 0)


def mixed_precision(kind_: str, bfloat16_gpu: bool | None = None) -> str:
    """bfloat16 on TPU and on a GPU that has it (gpu_has_bfloat16; no loss scaling, whose skipped steps would
    leave a run short of its last step), float16 on an older GPU (Keras's compile() wraps the optimizer in a
    LossScaleOptimizer under mixed_float16: keras/src/trainers/trainer.py, auto_scale_loss), float32 on CPU.
    Returns the policy name."""
    if kind_ == "gpu" and bfloat16_gpu is None:
        bfloat16_gpu = gpu_has_bfloat16()
    policy = {"tpu": "mixed_bfloat16", "gpu": "mixed_bfloat16" if bfloat16_gpu else "mixed_float16"}.get(
        kind_, "float32")
    keras_module().mixed_precision.set_global_policy(policy)
    return policy
