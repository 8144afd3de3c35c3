"""What train.py does between steps: a log line and TensorBoard every --log-every steps, checkpoints every
--checkpoint-every, on the optimizer's step whatever the epoch, on either backend."""
from __future__ import annotations

import os
import sys
import tempfile
import time
import types

import checkpoints
import keras
from tpuctl import runtime


class Board:
    """TensorBoard scalars: tf.summary where TensorFlow is the backend; elsewhere TensorBoard's own event writer
    (tensorboard.summary.Writer, the `tensorboard` package alone), so the JAX backend imports no TensorFlow. Without
    TensorBoard installed, nothing is written."""

    def __init__(self, logdir: str | None, backend: str):
        """logdir None: writes nothing (a host other than the first, across hosts)."""
        self.tf = self.writer = self.mirror = None
        if logdir is None:
            return
        if backend == "tensorflow":
            import tensorflow as tf
            self.tf, self.writer = tf, tf.summary.create_file_writer(logdir)
            return
        try:
            from tensorboard.summary import Writer
        except ImportError:
            return
        if "://" in logdir:
            # Events go to a local directory, copied to logdir through the job's store client at each flush. A gs://
            # log directory has no file system here but TensorFlow's (5 s to import), and none at all on a JAX host
            # without TensorFlow (a TPU VM on a base runtime, Compute Engine's TPU image): TensorBoard's stub hands
            # it to fsspec, which asks for gcsfs ("Please install gcsfs to access Google Storage",
            # fsspec/registry.py).
            local = tempfile.mkdtemp(prefix="tensorboard-")
            self.mirror, logdir = (local, logdir), local
        # TensorBoard's writer reaches files through `tensorboard.compat.tf`, which is TensorFlow wherever it is
        # installed (about 5 s to import) unless a module `tensorboard.compat.notf` exists, TensorBoard's own switch
        # to its TensorFlow-free stub (tensorboard/compat/__init__.py), which writes local files.
        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
        self.writer = Writer(logdir)

    def write(self, values: dict, step: int) -> None:
        if self.writer is None:
            return
        if self.tf is not None:
            with self.writer.as_default():
                for k, v in values.items():
                    self.tf.summary.scalar(k, v, step=step)
        else:
            for k, v in values.items():
                self.writer.add_scalar(k, v, step=step)
        self.writer.flush()
        if self.mirror:
            import fileio
            local, remote = self.mirror
            for name in os.listdir(local):
                fileio.copy(os.path.join(local, name), f"{remote}/{name}")


class Progress(keras.callbacks.Callback):
    """Log and TensorBoard on the optimizer's step; each line averages its own interval (metrics are reset)."""

    def __init__(self, start: int, steps: int, every: int, batch: int, lr, board: Board, history: dict,
                 chief: bool = True):
        super().__init__()
        self.start, self.steps, self.every, self.batch, self.lr, self.board = start, steps, every, batch, lr, board
        self.history, self.chief = history, chief

    def on_train_begin(self, logs=None):
        self.t, self.at = time.perf_counter(), self.start

    def on_train_batch_end(self, _, logs=None):
        step = runtime.step_of(self.model)
        logs = logs if logs is not None else {}
        if step % self.every and step < self.steps:
            return
        rate = (step - self.at) * self.batch / (time.perf_counter() - self.t)
        self.t, self.at = time.perf_counter(), step
        logs["examples_per_s"] = rate   # recorded by the metrics callback that follows
        values = {k: float(v) for k, v in logs.items()}
        self.history.setdefault("loss", []).append(values["loss"])
        self.history["examples_per_s"] = rate
        if self.chief:   # every host computes the same values; one prints them
            print(f"step {step:6d}  loss {values['loss']:.4f}  mlm_loss {values['mlm_loss']:.4f}  "
                  f"mlm_acc {values['mlm_acc']:.4f}  nsp_loss {values['nsp_loss']:.4f}  "
                  f"nsp_acc {values['nsp_acc']:.4f}  examples/s {rate:7.1f}", flush=True)
        self.board.write({**values, "learning_rate": float(self.lr(step))}, step)
        runtime.sync(self.model)   # JAX: the reset below must reach the state the next step starts from
        self.model.reset_metrics()


class Saver(keras.callbacks.Callback):
    """Checkpoints once the metrics callback has recorded the step: a kill between the two leaves metrics.json
    ahead of the checkpoint, never behind it, so goodput counts the steps a resume re-does. Each save is timed
    as checkpoint time (metrics.checkpointing), not as training. When: at every multiple of `every`, or (every
    None) at the first log line `minutes` after the last save; and at the end, whatever step the optimizer reached
    (one that skipped loss-scale steps under mixed_float16 ends short of --steps). Across hosts every host saves
    at the same steps (Keras's save is a collective there: checkpoints.save) and only the first (`chief`) writes."""

    def __init__(self, directory: str, steps: int, every: int | None, log_every: int, metrics, history: dict,
                 minutes: float = 10.0, chief: bool = True):
        super().__init__()
        self.directory, self.steps, self.every, self.log_every = directory, steps, every, log_every
        self.metrics, self.history, self.minutes, self.chief = metrics, history, minutes, chief
        self.saved, self.saved_at = -1, time.monotonic()

    def _due(self, step: int) -> bool:
        if self.every:
            return step % self.every == 0
        # every host saves together (checkpoints.save), so the first host's clock decides for all
        return step % self.log_every == 0 and \
            runtime.agree(time.monotonic() - self.saved_at >= self.minutes * 60)

    def save(self, step: int) -> None:
        if step != self.saved:
            with self.metrics.checkpointing():
                runtime.sync(self.model)
                checkpoints.save(self.directory, step, self.model, write=self.chief)
        self.saved, self.saved_at = step, time.monotonic()

    def on_train_batch_end(self, _, logs=None):
        step = runtime.step_of(self.model)
        last = step >= self.steps
        # A notebook service's session is ending (Kaggle's): stop at a log line, so the next session's lines
        # average the same steps as an uninterrupted run's, with a checkpoint there.
        ending = not last and step % self.log_every == 0 and runtime.agree(runtime.session_ending())
        if self._due(step) or last or ending:
            self.save(step)
        if ending:
            print(f"bert: the session ends: checkpoint at step {step}, the next session goes on", flush=True)
            self.model.stop_training = True
            self.history["continue"] = True

    def on_train_end(self, logs=None):
        self.save(runtime.step_of(self.model))
