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
    runtime.listen_for_stop()                     # SIGTERM sets a flag: save, then exit STOPPED_CODE
    if runtime.stop_requested(): ...              # read it between steps, after a save, in compile and eval
    runtime.phase("eval")                         # phases a drill signals in (the callbacks report the rest)
    runtime.data_position(step, rows_read)        # where the reader is: a drill checks a resume reads the same

TensorFlow is imported lazily, and only on the TensorFlow backend (or for a tf-keras job: TF_USE_LEGACY_KERAS=1,
which the job or tpuctl's host sets; prefer_legacy_keras is the host's rule for it).

The parts live in modules named for what they hold (keras_env, devices, training, environment, metrics_file,
files); a job imports them from here, the names below being its interface (docs/jobs.md lists them).
"""
from __future__ import annotations

from .devices import Replicas, global_batch, gpu_has_bfloat16, jax_replicas, kind, mixed_precision, strategy, tpu_target
from .environment import (CONTINUE_CODE, RESTART_CODE, data_dir, output_dir, output_of, run_id,
                          session_ending)
# what a drill and the run doctor read (phases.py), and SIGTERM read as a flag
from .phases import STOPPED_CODE, data_position, listen_for_stop, phase, saved, stop_requested
from .keras_env import backend, legacy_keras, prefer_legacy_keras, require_keras, version_tuple
from .metrics_file import Progress, metrics_callback
from .stacks import _arm as _arm_stacks
from .training import agree, scaled_lr, schedule, seed, step_of, sync

__all__ = ["STOPPED_CODE", "data_position", "listen_for_stop", "phase", "saved", "stop_requested",   # phases.py
           "CONTINUE_CODE", "RESTART_CODE", "Progress", "Replicas", "agree", "backend", "data_dir", "global_batch",
           "gpu_has_bfloat16", "jax_replicas", "kind", "legacy_keras", "metrics_callback", "mixed_precision",
           "output_dir", "output_of", "prefer_legacy_keras", "require_keras", "run_id", "scaled_lr", "schedule",
           "seed", "session_ending", "step_of", "strategy", "sync", "tpu_target", "version_tuple"]

_arm_stacks()   # under tpuctl's agent: SIGUSR1 writes every thread's stack for the run doctor (stacks.py)
