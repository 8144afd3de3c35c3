"""Imported BY jobs: the boilerplate every TPU tutorial repeats, done once and tested.

    from tpuctl import runtime
    strategy = runtime.strategy()                 # TPU (VM or legacy node), several GPUs, or the default
    batch = runtime.global_batch(32, strategy)    # per-replica batch x replicas
    lr = runtime.schedule(1e-4, batch, 256, warmup_steps=1000, total_steps=100000)
    runtime.output_dir(), runtime.data_dir()      # from TPUCTL_* with local fallbacks
    model.fit(..., callbacks=[runtime.metrics_callback()])   # metrics.json: `tpuctl jobs` shows step, loss, curve
    progress = runtime.Progress(start_step)       # the same for a loop of one's own, without TensorFlow;
    progress.step(step, seconds, loss=...)        # both record what goodput is computed from;
    with progress.checkpointing(): save()         # (or the callback's) a blocking save, counted as goodput's
                                                  # checkpoint badput, not as productive step time

TensorFlow is imported lazily, and TF_USE_LEGACY_KERAS=1 is set before it when tf-keras is installed (Keras 3 +
TPUStrategy model.fit has open failures on TPU VMs, keras-team/keras#19448); a job's own value wins.
"""
from __future__ import annotations

import importlib.util
import json
import os
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


prefer_legacy_keras()


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
    if environ.get("TPUCTL_ACCELERATOR", "").startswith("v") or os.path.exists("/dev/accel0") \
            or os.path.exists("/dev/vfio/0"):
        return "local", False
    return None


def strategy(tpu: str | None = "auto") -> Any:
    """TPUStrategy on a TPU; MirroredStrategy over several GPUs; else the default strategy (one GPU or the CPU).
    `tpu`: "auto" (tpu_target), a resolver argument, or None for no TPU.

    GPU memory growth is turned on first, so a job does not grab the whole card."""
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
    tf = _tf()
    if isinstance(strategy_, tf.distribute.TPUStrategy):
        return "tpu"
    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def global_batch(per_replica: int, strategy_: Any) -> int:
    return per_replica * strategy_.num_replicas_in_sync


def scaled_lr(base_lr: float, batch: int, base_batch: int, rule: str = "linear") -> float:
    """The learning rate defined at `base_batch`, at the global `batch`: "linear" (Goyal et al. 2017, for SGD) or
    "sqrt" (the square root of the batch ratio, which suits Adam: Malladi et al. 2022)."""
    ratio = batch / base_batch
    return base_lr * (ratio ** 0.5 if rule == "sqrt" else ratio)


def schedule(base_lr: float, batch: int, base_batch: int, warmup_steps: int, total_steps: int,
             end_lr: float = 0.0, rule: str = "linear") -> Any:
    """Linear warm-up to the scaled learning rate, then linear decay to end_lr at total_steps."""
    tf = _tf()
    peak = scaled_lr(base_lr, batch, base_batch, rule)

    class WarmupDecay(tf.keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[name-defined]  # TF is imported lazily, so its classes are values here
        def __call__(self, step: Any) -> Any:
            step = tf.cast(step, tf.float32)
            warm = peak * step / max(1, warmup_steps)
            frac = tf.clip_by_value((step - warmup_steps) / max(1, total_steps - warmup_steps), 0.0, 1.0)
            decay = peak + (end_lr - peak) * frac
            return tf.where(step < warmup_steps, warm, decay)

        def get_config(self) -> dict[str, float]:
            return {"peak": peak, "warmup_steps": warmup_steps, "total_steps": total_steps, "end_lr": end_lr}
    return WarmupDecay()


def mixed_precision(kind_: str) -> str:
    """bfloat16 on TPU, float16 on GPU (Keras adds loss scaling), float32 on CPU. Returns the policy name."""
    tf = _tf()
    policy = {"tpu": "mixed_bfloat16", "gpu": "mixed_float16"}.get(kind_, "float32")
    tf.keras.mixed_precision.set_global_policy(policy)
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


def metrics_callback(every: int | None = None, path: str | None = None) -> Any:
    """A Keras callback that rewrites `metrics.json` (tpuctl/metrics.py) in the output directory: at the end of
    each epoch (a job whose epochs are its log intervals, as jobs/bert_pretrain's are), or every `every` steps.
    The step is the optimizer's iteration count; a resumed run continues the history it finds there. What
    callbacks before it put into `logs` is recorded too. Each start of training and the time spent in steps are
    recorded for goodput (core/goodput.py); the step reached is written at least every TPUCTL_PROGRESS_SECONDS (10).
    A save the job makes inside `with callback.checkpointing():` counts as checkpoint time, never as step time, even
    when it runs inside a batch (a callback before this one saving at a batch's end)."""
    tf = _tf()
    flush_seconds = float(os.environ.get("TPUCTL_PROGRESS_SECONDS", "10"))
    from .core.metrics import FILE, MetricsLog, parse
    target = path or f"{output_dir()}/{FILE}"

    def write(log: MetricsLog) -> None:
        if _records_metrics():
            _write_text(target, json.dumps(log.to_json()), tf)

    class MetricsFile(tf.keras.callbacks.Callback):  # type: ignore[name-defined]  # TF is imported lazily, so its classes are values here
        def __init__(self) -> None:
            super().__init__()
            found = None
            if tf.io.gfile.exists(target):
                with tf.io.gfile.GFile(target, "rb") as f:
                    found = parse(f.read())
            self.log = found or MetricsLog()

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            self.log.begin(int(self.model.optimizer.iterations.numpy()), time.time())

        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.t0 = time.perf_counter()
            self.saved: list[float] = []

        def checkpointing(self) -> Any:
            return _timed_save(self.log, self.saved if hasattr(self, "saved") else [])

        def _record(self, logs: dict[str, Any] | None) -> None:
            self.log.record(int(self.model.optimizer.iterations.numpy()), logs or {})
            write(self.log)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if every is None:
                self._record(logs)

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            step = int(self.model.optimizer.iterations.numpy())
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
            if every and self.log.step < int(self.model.optimizer.iterations.numpy()) and getattr(self, "last", None):
                self._record(self.last)
            else:
                write(self.log)   # with what came after the last record: a final checkpoint's time
    return MetricsFile()


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
        from .core.metrics import FILE, MetricsLog, parse
        self.target = path or f"{output_dir()}/{FILE}"
        self.log = parse(_read_bytes(self.target)) or MetricsLog()
        self.log.begin(start_step, time.time())
        self.every = max(1, every)
        self.flush_seconds = flush_seconds if flush_seconds is not None else \
            float(os.environ.get("TPUCTL_PROGRESS_SECONDS", "10"))
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
