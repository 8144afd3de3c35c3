"""Goodput (core/goodput.py) from the attempts a job records through tpuctl.runtime.Progress: productive step time,
steps re-done after a resume, time lost between attempts."""
import json

from tpuctl.core import goodput
from tpuctl.core.metrics import MetricsLog


def test_a_resumed_run_counts_redone_steps_and_the_gap_as_badput():
    # 0..10 s: startup; steps 1-60 at 1 s each (10..70); preempted; the checkpoint was at step 50; back at 100 s,
    # steps 51-100 at 1 s each (100..150); the run ends at 150 s.
    attempts = [{"start": 10, "from": 0, "step": 60, "last": 70, "step_seconds": 60},
                {"start": 100, "from": 50, "step": 100, "last": 150, "step_seconds": 50}]
    g = goodput.breakdown(attempts, 0, 150)
    assert g["steps_redone"] == 10 and g["resumes"] == 1
    assert g["wasted_progress_seconds"] == 10 and g["productive_seconds"] == 100
    assert g["disruption_seconds"] == 30 and g["other_seconds"] == 10
    assert g["goodput_pct"] == round(100 * 100 / 150, 1)


def test_an_uninterrupted_run_is_all_steps_but_its_startup():
    g = goodput.breakdown([{"start": 5, "from": 0, "step": 10, "last": 15, "step_seconds": 10}], 0, 15)
    assert g["goodput_pct"] == round(100 * 10 / 15, 1) and g["resumes"] == 0 and g["steps_redone"] == 0


def test_progress_keeps_attempts_across_restarts(tmp_path, monkeypatch):
    from tpuctl import runtime
    monkeypatch.setenv("TPUCTL_OUTPUT_DIR", str(tmp_path))
    monkeypatch.delenv("TPUCTL_STORE", raising=False)
    p = runtime.Progress(0)
    for s in range(1, 7):
        p.step(s, 0.5, loss=10 - s)
    p = runtime.Progress(4)                  # restarted from the checkpoint at step 4
    for s in range(5, 9):
        p.step(s, 0.5, loss=10 - s)
    log = MetricsLog.from_json(json.loads((tmp_path / "metrics.json").read_text()))
    assert [(a["from"], a["step"]) for a in log.attempts] == [(0, 6), (4, 8)]
    assert log.step == 8 and [s for s, _ in log.history["loss"]] == list(range(1, 9))
    g = goodput.breakdown(log.attempts, log.attempts[0]["start"], log.attempts[-1]["last"])
    assert g["steps_redone"] == 2 and g["wasted_progress_seconds"] == 1.0


def test_only_the_first_host_of_a_run_across_hosts_writes_metrics(tmp_path, monkeypatch):
    """Every host runs the same steps: goodput counts the run once, as for one slice (runtime/files.py records_metrics)."""
    from tpuctl import runtime
    monkeypatch.setenv("TPUCTL_OUTPUT_DIR", str(tmp_path))
    monkeypatch.delenv("TPUCTL_STORE", raising=False)
    for worker in ("3", "1", "0", "2"):
        monkeypatch.setenv("TPUCTL_WORKER", worker)
        p = runtime.Progress(0)
        p.step(1, 0.5, loss=1.0)
    log = MetricsLog.from_json(json.loads((tmp_path / "metrics.json").read_text()))
    assert len(log.attempts) == 1


def test_the_first_steps_extra_time_after_each_start_is_startup_not_productive():
    """ml-goodput-measurement moves the first step's time past the segment's average step to PROGRAM_STARTUP
    (goodput.py _compute_segment_final_metrics): compilation is not productive training."""
    # each attempt: a 10 s first step (compiling), then 1 s steps
    attempts = [{"start": 0, "from": 0, "step": 10, "last": 20, "step_seconds": 19, "calls": 10, "first_seconds": 10},
                {"start": 30, "from": 10, "step": 15, "last": 44, "step_seconds": 14, "calls": 5, "first_seconds": 10}]
    g = goodput.breakdown(attempts, 0, 44)
    assert g["startup_seconds"] == 9 + 9 and g["productive_seconds"] == 10 + 5
    assert g["goodput_pct"] == round(100 * 15 / 44, 1)
    # one step only: nothing to compare it with, all of it productive (as the library's one-step segment)
    one = goodput.breakdown([{"start": 0, "from": 0, "step": 1, "last": 5, "step_seconds": 5, "calls": 1,
                              "first_seconds": 5}], 0, 5)
    assert one["startup_seconds"] == 0 and one["productive_seconds"] == 5


def test_blocking_checkpoint_saves_are_badput(tmp_path, monkeypatch):
    import time
    from tpuctl import runtime
    monkeypatch.setenv("TPUCTL_OUTPUT_DIR", str(tmp_path))
    monkeypatch.delenv("TPUCTL_STORE", raising=False)
    p = runtime.Progress(0)
    for s in range(1, 5):
        p.step(s, 0.5, loss=1.0)
        if s % 2 == 0:
            with p.checkpointing():
                time.sleep(0.2)
    p.flush()
    log = MetricsLog.from_json(json.loads((tmp_path / "metrics.json").read_text()))
    [a] = log.attempts
    assert a["calls"] == 4 and a["first_seconds"] == 0.5 and 0.4 <= a["checkpoint_seconds"] < 1.0
    g = goodput.breakdown(log.attempts, a["start"], a["start"] + 4)
    assert g["productive_seconds"] == 2.0 and g["checkpoint_seconds"] == round(a["checkpoint_seconds"], 1)
    assert g["other_seconds"] == round(4 - 2.0 - a["checkpoint_seconds"], 1)


def test_a_keras_save_inside_a_batch_is_checkpoint_time_not_step_time(tmp_path, monkeypatch):
    """A callback listed before metrics_callback() that saves at a batch's end runs inside the timed batch: wrapped
    in the callback's checkpointing(), that time leaves the step time and is counted as checkpoint badput."""
    import time
    import pytest
    keras = pytest.importorskip("keras")
    import numpy as np
    from tpuctl import runtime
    monkeypatch.setenv("TPUCTL_OUTPUT_DIR", str(tmp_path))
    monkeypatch.delenv("TPUCTL_STORE", raising=False)
    metrics_cb = runtime.metrics_callback(every=1)

    class Saver(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                with metrics_cb.checkpointing():
                    time.sleep(0.5)

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(np.zeros((8, 2)), np.zeros((8, 1)), batch_size=2, epochs=1, verbose=0, callbacks=[Saver(), metrics_cb])
    [a] = MetricsLog.from_json(json.loads((tmp_path / "metrics.json").read_text())).attempts
    assert a["calls"] == 4 and 0.5 <= a["checkpoint_seconds"] < 1.5
    assert a["step_seconds"] - a["first_seconds"] < 0.5, a      # the save is not in the steps after the first


def test_a_run_that_made_no_step_has_no_goodput():
    """Issue 40: 7.9 s reported as step time, step 0, goodput 39%. No step kept, nothing productive; a later attempt
    that does step still counts its own steps."""
    none = {"start": 0, "from": 0, "step": 0, "last": 8, "step_seconds": 7.9, "calls": 1, "first_seconds": 7.9}
    g = goodput.breakdown([none], 0, 20)
    assert g["goodput_pct"] == 0 and g["productive_seconds"] == 0 and g["other_seconds"] == 20
    then = {"start": 30, "from": 0, "step": 10, "last": 40, "step_seconds": 10}
    assert goodput.breakdown([none, then], 0, 40)["productive_seconds"] == 10
