"""Imported BY jobs: the boilerplate every TPU tutorial repeats, done once and tested, for Keras 3 on whichever
backend the job runs on (Keras's own KERAS_BACKEND, which tpuctl sets: tensorflow or jax).

    from tpuctl import runtime
    strategy = runtime.strategy()                 # TF: TPUStrategy, MirroredStrategy or the default;
                                                  # JAX: keras.distribution.DataParallel over every local device
    runtime.seed(0)                               # keras.utils.set_random_seed, without TensorFlow on JAX
    batch = runtime.global_batch(32, strategy)    # per-replica batch x replicas
    lr = runtime.schedule(1e-4, batch, 256, warmup_steps=1000, total_steps=100000)
    runtime.output_dir(), runtime.data_dir()      # from TPUCTL_* with local fallbacks
    model.fit(..., callbacks=[runtime.metrics_callback()])   # metrics.json: `tpuctl jobs` shows step, loss, curve
    progress = runtime.Progress(start_step)       # the same for a loop of one's own, without TensorFlow;
    progress.step(step, seconds, loss=...)        # both record what goodput is computed from;
    with progress.checkpointing(): save()         # (or the callback's) a blocking save, counted as goodput's
                                                  # checkpoint badput, not as productive step time

TensorFlow is imported lazily, and only on the TensorFlow backend (or for a tf-keras job: TF_USE_LEGACY_KERAS=1,
which the job or tpuctl's host sets; prefer_legacy_keras below is the host's rule for it).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, MutableMapping


def prefer_legacy_keras(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set TF_USE_LEGACY_KERAS=1 (unless already set) only where tf-keras is installed: with the variable set and
    tf-keras absent, `tf.keras` itself fails to import. True when tf.keras will be tf-keras."""
    if importlib.util.find_spec("tf_keras") is None:
        return environ.get("TF_USE_LEGACY_KERAS") == "1"
    environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    return environ["TF_USE_LEGACY_KERAS"] == "1"


def legacy_keras() -> bool:
    """True for a tf-keras (Keras 2) job: TF_USE_LEGACY_KERAS=1 makes tf.keras tf-keras (TensorFlow >= 2.16)."""
    return os.environ.get("TF_USE_LEGACY_KERAS") == "1" and importlib.util.find_spec("tf_keras") is not None


def backend() -> str:
    """The Keras backend of this process: Keras 3's own choice (KERAS_BACKEND, else ~/.keras/keras.json, else
    tensorflow: keras/src/backend/config.py), or "tensorflow" for a tf-keras job or where Keras 3 is absent."""
    if legacy_keras() or importlib.util.find_spec("keras") is None:
        return "tensorflow"
    import keras
    if not hasattr(keras, "backend") or not hasattr(keras.backend, "backend"):
        return "tensorflow"   # Keras 2 installed as `keras`
    return str(keras.backend.backend())


def _keras() -> Any:
    """tf.keras for a tf-keras job, else Keras 3."""
    if legacy_keras():
        return _tf().keras
    import keras
    return keras


def _tf() -> Any:
    import tensorflow as tf
    return tf


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
    from .core.backends import is_tpu_type
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


def version_tuple(version: str) -> tuple[int, ...]:
    """"3.11.2" -> (3, 11, 2); what follows the numbers is dropped ("3.12.0.dev2024" -> (3, 12, 0))."""
    import re
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version)
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


def require_keras(floor: str, what: str, found: str | None = None) -> None:
    """Ends the job with one line naming the Keras `what` needs when the installed one is older (a feature Keras
    lacks otherwise fails deep inside fit(), or, worse, quietly does something else)."""
    if found is None:
        import keras
        found = str(keras.__version__)
    if version_tuple(found) < version_tuple(floor):
        raise SystemExit(f"error: {what} needs keras>={floor}; this environment has keras {found}\n"
                         f"hint: pip install -U 'keras>={floor}' (or list it in the job's requirements.txt)")


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
    tf = _tf()
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
    tf = _tf()
    if isinstance(strategy_, tf.distribute.TPUStrategy):
        return "tpu"
    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def global_batch(per_replica: int, strategy_: Any) -> int:
    return per_replica * strategy_.num_replicas_in_sync


def seed(value: int) -> None:
    """keras.utils.set_random_seed(value) without its TensorFlow import on JAX: Keras's function also calls
    tf.random.set_seed wherever TensorFlow is installed (keras/src/utils/rng_utils.py: "the TensorFlow seed is set
    even if you're not using TensorFlow as your backend"), about 5 s of start-up. On JAX what it seeds that matters
    is Python's random and numpy's: every unseeded Keras initializer and SeedGenerator (dropout) draws its seed from
    Python's random (keras/src/random/seed_generator.py make_default_seed). Not done here: keras.utils.get_random_seed
    stays None, and a global SeedGenerator made before this call (keras.random.* called without a seed) is not
    reset. Keras's own function where TensorFlow is the backend or already imported, or on any other backend."""
    if backend() != "jax" or "tensorflow" in sys.modules:
        _keras().utils.set_random_seed(value)
        return
    import random

    import numpy as np
    random.seed(value)
    np.random.seed(value)


def scaled_lr(base_lr: float, batch: int, base_batch: int, rule: str = "linear") -> float:
    """The learning rate defined at `base_batch`, at the global `batch`: "linear" (Goyal et al. 2017, for SGD) or
    "sqrt" (the square root of the batch ratio, which suits Adam: Malladi et al. 2022)."""
    ratio = batch / base_batch
    return base_lr * (ratio ** 0.5 if rule == "sqrt" else ratio)


def schedule(base_lr: float, batch: int, base_batch: int, warmup_steps: int, total_steps: int,
             end_lr: float = 0.0, rule: str = "linear") -> Any:
    """Linear warm-up to the scaled learning rate, then linear decay to end_lr at total_steps."""
    keras = _keras()
    ops = keras.ops if hasattr(keras, "ops") else _tf()   # Keras 3's ops, or TensorFlow's for tf-keras
    clip = ops.clip if hasattr(ops, "clip") else ops.clip_by_value
    peak = scaled_lr(base_lr, batch, base_batch, rule)

    class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[name-defined]  # Keras is imported lazily, so its classes are values here
        def __call__(self, step: Any) -> Any:
            step = ops.cast(step, "float32")
            warm = peak * step / max(1, warmup_steps)
            frac = clip((step - warmup_steps) / max(1, total_steps - warmup_steps), 0.0, 1.0)
            decay = peak + (end_lr - peak) * frac
            return ops.where(step < warmup_steps, warm, decay)

        def get_config(self) -> dict[str, float]:
            return {"peak": peak, "warmup_steps": warmup_steps, "total_steps": total_steps, "end_lr": end_lr}
    return WarmupDecay()


def gpu_has_bfloat16() -> bool:
    """Whether this process's (first) GPU computes in bfloat16 natively: NVIDIA compute capability 8.0 or later
    (Ampere on: A100, L4, H100, H200; CUDA C++ Programming Guide, "Arithmetic Instructions"). JAX names it
    `device.compute_capability` ("9.0"), TensorFlow `get_device_details(gpu)["compute_capability"]` ((9, 0))."""
    if backend() == "jax":
        import jax
        return version_tuple(str(getattr(jax.devices()[0], "compute_capability", "") or "")) >= (8,)
    tf = _tf()
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
    _keras().mixed_precision.set_global_policy(policy)
    return policy


CONTINUE_CODE = 85   # "my checkpoint is written: run me again in the next session" (a notebook service's chain)
# "restart me from my checkpoint": xpk's code (its JobSet restarts exit 42 and 127-255); `submit --max-restarts N`
# lets a run restart up to N times (tpuctl/host/restarts.py). $TPUCTL_RESTARTS says how many restarts came before.
RESTART_CODE = 42


def session_ending(margin: float = 0.0) -> bool:
    """True once the session this job runs in is within `margin` seconds of its end: a notebook service's session
    (Kaggle's, TPUCTL_SESSION_DEADLINE in epoch seconds) that tpuctl continues in the next one. A job that checks it
    between steps saves its checkpoint and exits with CONTINUE_CODE, and loses no step; one that does not is
    stopped at the deadline and resumes from its last checkpoint. Always False elsewhere."""
    deadline = float(os.environ.get("TPUCTL_SESSION_DEADLINE") or 0)
    return bool(deadline) and time.time() >= deadline - margin


def output_dir(default: str = "output") -> str:
    return os.environ.get("TPUCTL_OUTPUT_DIR") or default


def output_of(run_id_: str) -> str:
    """Another run's output directory on this cluster's store (a bucket on Google Cloud): how a job reads what an
    earlier run wrote, e.g. a second training phase starting from the first one's checkpoints."""
    from tpuctl.core import layout
    store = os.environ.get("TPUCTL_STORE")
    if not store:
        raise RuntimeError("TPUCTL_STORE is not set: only a job started by tpuctl knows its cluster's store")
    return f"{store.rstrip('/')}/{layout.run_output(run_id_)}"


def data_dir(default: str = "data") -> str:
    return os.environ.get("TPUCTL_DATA_DIR") or default


def run_id() -> str:
    return os.environ.get("TPUCTL_RUN_ID", "local")


@contextmanager
def _timed_save(log: Any, saved: list[float]) -> Iterator[None]:
    """Times a blocking checkpoint save into `log` (metrics.MetricsLog.checkpointed), and into `saved` for a step
    timer that must leave it out."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        took = time.perf_counter() - t0
        log.checkpointed(took, time.time())
        saved.append(took)


def metrics_callback(every: int | None = None, path: str | None = None, start: int | None = None,
                     end: int | None = None) -> Any:
    """A Keras callback that rewrites `metrics.json` (tpuctl/metrics.py) in the output directory: at the end of
    each epoch (a job whose epochs are its log intervals, as jobs/bert_pretrain's are), or every `every` steps.
    The step: `start` (default: the optimizer's iteration count when training starts) plus the batches Keras has
    run since, counted on the host from its batch index, at most `end`; so no batch waits for the device to tell
    its step, and a job that counts its steps as batches consumed (jobs/bert_pretrain, whose loss-scaled steps
    may be skipped) passes its own start. A resumed run continues the history it finds there. What callbacks
    before it put into `logs` is recorded too (values still on the device are read only when recorded). Each start
    of training and the time spent in steps are recorded for goodput (core/goodput.py); the step reached is written
    at least every TPUCTL_PROGRESS_SECONDS (10).
    A save the job makes inside `with callback.checkpointing():` counts as checkpoint time, never as step time, even
    when it runs inside a batch (a callback before this one saving at a batch's end)."""
    keras = _keras()
    from .core import knobs
    from .core.metrics import FILE, MetricsLog, parse
    flush_seconds = knobs.number("TPUCTL_PROGRESS_SECONDS", 10)
    target = path or f"{output_dir()}/{FILE}"

    def write(log: MetricsLog) -> None:
        if _records_metrics():
            _write_text(target, json.dumps(log.to_json()))

    class MetricsFile(keras.callbacks.Callback):  # type: ignore[name-defined]  # Keras is imported lazily, so its classes are values here
        def __init__(self) -> None:
            super().__init__()
            found = _read_bytes(target)
            self.log = (parse(found) if found is not None else None) or MetricsLog()

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            self.step = step_of(self.model) if start is None else start
            self.log.begin(self.step, time.time())

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.base = self.step   # Keras's batch index starts again each epoch

        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.t0 = time.perf_counter()
            self.saved: list[float] = []

        def checkpointing(self) -> Any:
            return _timed_save(self.log, self.saved if hasattr(self, "saved") else [])

        def _record(self, logs: dict[str, Any] | None) -> None:
            self.log.record(self.step, logs or {})
            write(self.log)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if every is None:
                self._record(logs)

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            step = self.base + batch + 1
            self.step = step = step if end is None else min(step, end)
            self.log.stepped(step, time.perf_counter() - self.t0 - sum(getattr(self, "saved", [])), time.time())
            if every and step % every == 0:
                self._record(logs)
                self.flushed = time.monotonic()
            elif time.monotonic() - getattr(self, "flushed", 0.0) >= flush_seconds:
                write(self.log)   # the step reached, so that the steps a preemption makes it re-do are known
                self.flushed = time.monotonic()
            self.last = logs

        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            # a run whose last step is not a multiple of `every` still ends with its last step in the file
            if every and self.log.step < self.step and getattr(self, "last", None):
                self._record(self.last)
            else:
                write(self.log)   # with what came after the last record: a final checkpoint's time
    return MetricsFile()


def agree(flag: bool) -> bool:
    """The first process's `flag`, on every process of a JAX run across hosts (a broadcast: call it on all of them
    at the same point), so that a decision taken by a clock (a checkpoint due, a session ending) is the same
    everywhere; the flag itself anywhere else."""
    if backend() != "jax" or "jax" not in sys.modules:
        return flag
    import jax
    if jax.process_count() == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils
    return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def sync(model: Any) -> None:
    """Puts the state a JAX fit() holds outside the model back into the model's variables (Keras's
    jax_state_sync, keras/src/backend/jax/trainer.py): what a callback does before it reads or changes them (a
    checkpoint, a metrics reset). Nothing to do on TensorFlow."""
    getattr(model, "jax_state_sync", lambda: None)()


def step_of(model: Any) -> int:
    """The optimizer's step, without putting the trainer's state back into the model (sync): inside a JAX fit()
    the model's own variables lag behind the state the train function carries (`model._jax_state`, what the
    trainer hands callbacks), so read it there. Reading it waits for the device to finish the step that made it:
    a callback that wants the step after every batch counts batches instead (metrics_callback)."""
    opt = model.optimizer
    state = getattr(model, "_jax_state", None)
    if state and state.get("optimizer_variables") and not getattr(model, "_jax_state_synced", True):
        for ref, value in zip(opt.variables, state["optimizer_variables"]):
            if ref is opt.iterations:
                return int(value)
    return int(opt.iterations.numpy())


def _records_metrics() -> bool:
    """Only the first host of a run across hosts writes metrics.json: every host runs the same steps of one
    program, and goodput counts the run's starts once, as for one slice (N writers would interleave N histories)."""
    return os.environ.get("TPUCTL_WORKER", "0") in ("", "0")


def _write_text(target: str, text: str, tf: Any = None) -> None:
    """Replace `target` whole: a local file by rename (readers never see half of one); in the cluster's store
    through tpuctl's own store client (no TensorFlow needed); elsewhere through TensorFlow's file system."""
    store = os.environ.get("TPUCTL_STORE", "").rstrip("/")
    if "://" in target and store and target.startswith(store + "/"):
        from .providers.stores import open_store
        open_store(store).write(target[len(store) + 1:], text.encode())
        return
    if "://" in target:
        tf = tf or _tf()
        with tf.io.gfile.GFile(target, "w") as f:
            f.write(text)
        return
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    tmp = f"{target}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, target)


def _read_bytes(target: str) -> bytes | None:
    store = os.environ.get("TPUCTL_STORE", "").rstrip("/")
    if "://" in target and store and target.startswith(store + "/"):
        from .providers.stores import open_store
        return open_store(store).read(target[len(store) + 1:])
    if "://" in target:
        gfile = _tf().io.gfile
        if not gfile.exists(target):
            return None
        with gfile.GFile(target, "rb") as f:
            return bytes(f.read())
    try:
        with open(target, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


class Progress:
    """metrics.json for a training loop of one's own (no Keras, no TensorFlow needed): `Progress(start_step)` once
    the checkpoint is restored, then `step(step, seconds, **metrics)` after each step, `seconds` being the time
    the step itself took. Metrics are recorded every `every` steps; the file is written then, and at least every
    `flush_seconds` (TPUCTL_PROGRESS_SECONDS, 10) so that the steps an interruption makes the job re-do are known."""

    def __init__(self, start_step: int = 0, every: int = 1, path: str | None = None,
                 flush_seconds: float | None = None) -> None:
        from .core import knobs
        from .core.metrics import FILE, MetricsLog, parse
        self.target = path or f"{output_dir()}/{FILE}"
        self.log = parse(_read_bytes(self.target)) or MetricsLog()
        self.log.begin(start_step, time.time())
        self.every = max(1, every)
        self.flush_seconds = flush_seconds if flush_seconds is not None else \
            knobs.number("TPUCTL_PROGRESS_SECONDS", 10)
        self.flushed = time.monotonic()

    def step(self, step: int, seconds: float, **metrics: float) -> None:
        self.log.stepped(step, seconds, time.time())
        if step % self.every == 0:
            self.log.record(step, metrics)
            self.flush()
        elif time.monotonic() - self.flushed >= self.flush_seconds:
            self.flush()

    def checkpointing(self) -> Any:
        """`with progress.checkpointing(): save()`: the save's time is goodput's checkpoint badput."""
        return _timed_save(self.log, [])

    def flush(self) -> None:
        if _records_metrics():
            _write_text(self.target, json.dumps(self.log.to_json()))
        self.flushed = time.monotonic()
