"""What train.py does between steps: a log line and TensorBoard every --log-every steps, checkpoints every
--checkpoint-every, on either backend. The step is the batches the run has consumed, counted on the host: reading
the optimizer's iteration count (a device value) after each batch would wait for that batch's step to finish, and
under mixed_float16 it does not advance on a step the loss scale skips (Keras's LossScaleOptimizer applies nothing
then: keras/src/optimizers/loss_scale_optimizer.py, whose `iterations` is the inner optimizer's), which would
leave the data position, the checkpoints' names and --steps out of line with the batches read. Values on the
device are read only at the steps that log or save (Lazy below)."""
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


class Lazy(keras.callbacks.CallbackList):
    """Keras's CallbackList turns every batch's logs into Python floats before any callback sees them
    (keras/src/callbacks/callback_list.py, _on_train_batch_end -> python_utils.pythonify_logs), which waits for the
    device to finish that batch's step: the host cannot queue the next one meanwhile. (Keras skips it only when no
    callback has an on_train_batch_end, or on JAX runs them in a thread when all are `async_safe`; ours change the
    model between steps, so they run in line.) This list hands a train batch's logs on as the backend's own values
    (jax.Array, tf.Tensor): a callback calls float() on them only at the steps it logs. fit() takes a CallbackList
    as it is (keras/src/backend/jax/trainer.py and tensorflow/trainer.py: `if not isinstance(callbacks,
    CallbackList)`), so this one is made as fit would make it: with a History, the model and fit's params."""

    def __init__(self, callbacks: list, model, steps: int):
        super().__init__(callbacks, add_history=True, model=model, verbose=0, epochs=1, steps=steps)

    def on_train_batch_end(self, batch, logs=None):
        logs = dict(logs or {})   # one dict for all: Progress adds examples_per_s for the metrics callback
        for callback in self.callbacks:
            callback.on_train_batch_end(batch, logs=logs)


class Stepped(keras.callbacks.Callback):
    """Knows the step from Keras's batch index alone: fit runs one epoch of the steps left (train.py), so after
    batch index i the run has consumed `start` + i + 1 batches; no more than `steps` (Keras reports a last
    execution of --steps-per-execution steps cut short by the data's end as a whole one:
    keras/src/trainers/epoch_iterator.py)."""

    def __init__(self, start: int, steps: int):
        super().__init__()
        self.start, self.steps, self.step = start, steps, start

    def stepped(self, batch: int) -> int:
        self.step = min(self.start + batch + 1, self.steps)
        return self.step


class Progress(Stepped):
    """Log and TensorBoard every `every` steps and at the last; each line averages its own interval (metrics are
    reset). Only those steps read the logs' device values."""

    def __init__(self, start: int, steps: int, every: int, batch: int, lr, board: Board, history: dict,
                 chief: bool = True):
        super().__init__(start, steps)
        self.every, self.batch, self.lr, self.board = every, batch, lr, board
        self.history, self.chief = history, chief

    def on_train_begin(self, logs=None):
        self.t, self.at = time.perf_counter(), self.start

    def on_train_batch_end(self, batch, logs=None):
        step = self.stepped(batch)
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
        runtime.sync(self.model)   # JAX: the reset below must reach the state the next step starts from
        # the rate the optimizer applies next: its schedule at its own count of updates (what Keras's
        # optimizer.learning_rate reads), behind the step by the updates a float16 loss scale skipped
        self.board.write({**values, "learning_rate": float(self.lr(runtime.step_of(self.model)))}, step)
        self.model.reset_metrics()


class Position(Stepped):
    """The data reader's own position at each step's end, for `tpuctl drill` (runtime.data_position: kept in memory,
    written to phase.json with the checkpoint of that step, never per step). `reader`: records.Batches or
    data.Began (data.reader), asked for its position after the batches this start consumed; placed before the
    Saver, so a checkpoint of step s goes with the position at s."""

    def __init__(self, start: int, steps: int, reader):
        super().__init__(start, steps)
        self.reader = reader

    def on_train_batch_end(self, batch, logs=None):
        step = self.stepped(batch)
        position = self.reader.position(step - self.start)
        if position is not None:
            runtime.data_position(step, position)


def _across_hosts() -> bool:
    return runtime.backend() == "jax" and "jax" in sys.modules and sys.modules["jax"].process_count() > 1


class Saver(Stepped):
    """Checkpoints once the metrics callback has recorded the step: a kill between the two leaves metrics.json
    ahead of the checkpoint, never behind it, so goodput counts the steps a resume re-does. Each save is timed
    as checkpoint time (metrics.checkpointing), not as training. When: at every multiple of `every`, or (every
    None) at the first log line `minutes` after the last save; and at the end (--steps, or where a callback
    stopped the run). Across hosts every host saves at the same steps (Keras's save is a collective there:
    checkpoints.save) and only the first (`chief`) writes."""

    def __init__(self, directory: str, start: int, steps: int, every: int | None, log_every: int, metrics,
                 history: dict, minutes: float = 10.0, chief: bool = True):
        super().__init__(start, steps)
        self.directory, self.every, self.log_every = directory, every, log_every
        self.metrics, self.history, self.minutes, self.chief = metrics, history, minutes, chief
        self.saved, self.saved_at = -1, time.monotonic()
        self.saving = False

    def _due(self, step: int) -> bool:
        if self.every:
            return step % self.every == 0
        # every host saves together (checkpoints.save), so the first host's clock decides for all
        return step % self.log_every == 0 and \
            runtime.agree(time.monotonic() - self.saved_at >= self.minutes * 60)

    def nothing_unsaved(self) -> bool:
        """No step since this start's checkpoint (or the last save), and no save under way: what a SIGTERM would
        lose now is nothing, so the job may end at once (train.py)."""
        return not self.saving and self.step == (self.saved if self.saved >= 0 else self.start)

    def save(self, step: int) -> None:
        self.saving = True
        try:
            self._save(step)
        finally:
            self.saving = False

    def _save(self, step: int) -> None:
        if step != self.saved:
            # the steps still queued on the device finish first, outside the checkpoint's time (one value of the
            # last step's state waits for that step, and so for all before it)
            runtime.sync(self.model)
            self.model.optimizer.iterations.numpy()
            with self.metrics.checkpointing():
                checkpoints.save(self.directory, step, self.model, write=self.chief)
        self.saved, self.saved_at = step, time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        step = self.stepped(batch)
        last = step >= self.steps
        # A notebook service's session is ending (Kaggle's): stop at a log line, so the next session's lines
        # average the same steps as an uninterrupted run's, with a checkpoint there.
        ending = not last and step % self.log_every == 0 and runtime.agree(runtime.session_ending())
        if self._due(step) or last or ending:
            self.save(step)
        # SIGTERM (a spot VM's notice, a cancel, `tpuctl drill`): read here, right after any save, so a signal that
        # came during a save (or the first step's compile) needs no second one; the checkpoint first, then out
        # (across hosts, agree is a broadcast: read at log lines only, as the session's end is)
        if not last and (step % self.log_every == 0 or not _across_hosts()) and \
                runtime.agree(runtime.stop_requested()):
            self.save(step)
            print(f"bert: SIGTERM: checkpoint at step {step}; exiting for a restart from it", flush=True)
            self.model.stop_training = True
            self.history["stopped"] = True
        if ending:
            print(f"bert: the session ends: checkpoint at step {step}, the next session goes on", flush=True)
            self.model.stop_training = True
            self.history["continue"] = True

    def on_train_end(self, logs=None):
        self.save(self.step)
