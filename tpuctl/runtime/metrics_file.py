"""metrics.json from a Keras fit() (metrics_callback) or a loop of one's own (Progress): steps, metrics, and what
goodput is computed from (each start, step time, checkpoint saves)."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Any, Iterator

from .environment import output_dir
from . import phases
from .files import read_bytes, records_metrics, write_text
from .keras_env import keras_module
from .training import step_of


@contextmanager
def _timed_save(log: Any, saved: list[float], step: int | None = None) -> Iterator[None]:
    """Times a blocking checkpoint save into `log` (metrics.MetricsLog.checkpointed), and into `saved` for a step
    timer that must leave it out; the save phase (phases.py) while it lasts, and the step it saved once done."""
    t0 = time.perf_counter()
    phases.phase("save", step)
    done = False
    try:
        yield
        done = True
    finally:
        took = time.perf_counter() - t0
        log.checkpointed(took, time.time())
        saved.append(took)
        if done:
            phases.saved(step if step is not None else int(log.step))


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
    keras = keras_module()
    from ..core import knobs
    from ..core.metrics import FILE, MetricsLog, parse
    flush_seconds = knobs.number("TPUCTL_PROGRESS_SECONDS", 10)
    target = path or f"{output_dir()}/{FILE}"
    phases._at(target.rsplit("/", 1)[0] if "/" in target else ".")

    def write(log: MetricsLog) -> None:
        if records_metrics():
            write_text(target, json.dumps(log.to_json()))

    class MetricsFile(keras.callbacks.Callback):  # type: ignore[name-defined]  # Keras is imported lazily, so its classes are values here
        def __init__(self) -> None:
            super().__init__()
            found = read_bytes(target)
            self.log = (parse(found) if found is not None else None) or MetricsLog()

        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            self.step = step_of(self.model) if start is None else start
            self.log.begin(self.step, time.time())
            phases.phase("start", self.step)

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.base = self.step   # Keras's batch index starts again each epoch

        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.t0 = time.perf_counter()
            self.saved: list[float] = []
            if not hasattr(self, "compiled"):
                self.compiled = True
                phases.phase("compile", self.step)   # the first step of this start compiles (or loads) it

        def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
            phases.phase("eval", getattr(self, "step", None))

        def checkpointing(self) -> Any:
            return _timed_save(self.log, self.saved if hasattr(self, "saved") else [], getattr(self, "step", None))

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
            phases.phase("step", step)
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


class Progress:
    """metrics.json for a training loop of one's own (no Keras, no TensorFlow needed): `Progress(start_step)` once
    the checkpoint is restored, then `step(step, seconds, **metrics)` after each step, `seconds` being the time
    the step itself took. Metrics are recorded every `every` steps; the file is written then, and at least every
    `flush_seconds` (TPUCTL_PROGRESS_SECONDS, 10) so that the steps an interruption makes the job re-do are known."""

    def __init__(self, start_step: int = 0, every: int = 1, path: str | None = None,
                 flush_seconds: float | None = None) -> None:
        from ..core import knobs
        from ..core.metrics import FILE, MetricsLog, parse
        self.target = path or f"{output_dir()}/{FILE}"
        phases._at(self.target.rsplit("/", 1)[0] if "/" in self.target else ".")
        self.log = parse(read_bytes(self.target)) or MetricsLog()
        self.log.begin(start_step, time.time())
        self.at = start_step
        phases.phase("start", start_step)
        self.every = max(1, every)
        self.flush_seconds = flush_seconds if flush_seconds is not None else \
            knobs.number("TPUCTL_PROGRESS_SECONDS", 10)
        self.flushed = time.monotonic()

    def step(self, step: int, seconds: float, **metrics: float) -> None:
        self.log.stepped(step, seconds, time.time())
        self.at = step
        phases.phase("step", step)
        if step % self.every == 0:
            self.log.record(step, metrics)
            self.flush()
        elif time.monotonic() - self.flushed >= self.flush_seconds:
            self.flush()

    def checkpointing(self) -> Any:
        """`with progress.checkpointing(): save()`: the save's time is goodput's checkpoint badput, and the phase
        `save` while it lasts (phases.py)."""
        return _timed_save(self.log, [], getattr(self, "at", None))

    def flush(self) -> None:
        if records_metrics():
            write_text(self.target, json.dumps(self.log.to_json()))
        self.flushed = time.monotonic()
