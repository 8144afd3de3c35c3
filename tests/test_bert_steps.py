"""jobs/bert_pretrain's step is the batches it consumed, counted on the host (issue 50, "defaults a user can keep"):
its callbacks read the device only at the steps that log or save, and under mixed_float16, where Keras's
LossScaleOptimizer skips the update of a step whose gradients overflow (its `iterations` stays put:
keras/src/optimizers/loss_scale_optimizer.py), a run stopped and resumed reads on from the batch it stopped at and
ends at --steps with its checkpoint, as an uninterrupted run does. On the JAX backend (one CPU device), float16
forced as an older GPU gets it, and a huge first loss scale so that the first steps overflow."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_XLA_FLAGS, built_once

JOB = Path(__file__).parent.parent / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))

import corpus  # noqa: E402
import prepare  # noqa: E402

STEPS, EVERY = 12, 4

# train.main with notes beside it: each read of a device value by the host (a jax.Array made a Python number or a
# numpy array: jax/_src/array.py's conversions, numpy's array and asarray, which Keras's convert_to_numpy and
# Variable.numpy use) tagged with the number of the train-function call before it;
# the batch numbers the reader makes (records.Batches.make: the data position); each checkpoint's step with the
# optimizer's count in it. The policy is forced to mixed_float16 (runtime.mixed_precision picks it from the
# device: float16 on a GPU without bfloat16), and Keras's compile() wraps the optimizer in a LossScaleOptimizer
# (keras/src/trainers/trainer.py) starting at 2**24, so that the first steps' float16 gradients overflow.
DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import jax, keras, numpy as np
from jax._src import array
from keras.src.backend.jax import trainer as jax_trainer
from keras.src.trainers import trainer
import callbacks, checkpoints, records
from tpuctl import runtime
notes = {"made": [], "reads": [], "saved": [], "board": []}
calls = [None]
def read():
    if calls[0] is not None:
        notes["reads"].append(calls[0])
for name in ("__float__", "__int__", "__bool__", "__index__", "__array__", "__format__", "item", "tolist"):
    def method(self, *a, _real=getattr(array.ArrayImpl, name), **k):
        read()
        return _real(self, *a, **k)
    setattr(array.ArrayImpl, name, method)
for name in ("array", "asarray"):   # numpy reads a CPU jax.Array by the buffer protocol, past its __array__
    def function(x, *a, _real=getattr(np, name), **k):
        if isinstance(x, jax.Array):
            read()
        return _real(x, *a, **k)
    setattr(np, name, function)
make_train_function = jax_trainer.JAXTrainer.make_train_function
def counted(self, force=False):
    make_train_function(self, force)
    step = self.train_function
    def train_function(state, data):
        calls[0] = (calls[0] or 0) + 1
        return step(state, data)
    self.train_function = train_function
jax_trainer.JAXTrainer.make_train_function = counted
make = records.Batches.make
def made(self, b):
    notes["made"].append(int(b))
    return make(self, b)
records.Batches.make = made
save = checkpoints.save
def saved(directory, step, model, **kw):
    notes["saved"].append([step, int(model.optimizer.iterations.numpy())])
    return save(directory, step, model, **kw)
checkpoints.save = saved
board = callbacks.Board.write
def boarded(self, values, step):
    notes["board"].append([step, values["learning_rate"]])
    return board(self, values, step)
callbacks.Board.write = boarded
schedule, schedules = runtime.schedule, []
runtime.schedule = lambda *a, **k: schedules.append(schedule(*a, **k)) or schedules[-1]
def float16(kind, bfloat16_gpu=None):
    keras.mixed_precision.set_global_policy("mixed_float16")
    return "mixed_float16"
runtime.mixed_precision = float16
class Huge(trainer.LossScaleOptimizer):
    def __init__(self, inner, **kw):
        super().__init__(inner, initial_scale=2.0 ** 24, **kw)
trainer.LossScaleOptimizer = Huge
import train
try:
    notes["result"] = train.main(sys.argv[2:])
except SystemExit as e:
    notes["exit"] = e.code
notes["lr"] = [float(schedules[0](n)) for n in range(int(sys.argv[sys.argv.index("--steps") + 1]) + 1)]
print("NOTES " + json.dumps(notes))
"""


# The same reads on the TensorFlow backend (float32, as on a CPU): each read of an EagerTensor's value
# (tensorflow/python/framework/ops.py _EagerTensorBase's conversions, which numpy's reads go through), tagged with
# the train-function call before it, and whether Keras's trainer made it: its train function reads whether the
# tf.data iterator still had a batch (keras/src/backend/tensorflow/trainer.py `function`:
# `if not opt_outputs.has_value(): raise StopIteration`) once per execution of --steps-per-execution steps.
TF_DRIVER = """
import json, sys, traceback
sys.path.insert(0, sys.argv[1])
from tensorflow.python.framework import ops
from keras.src.backend.tensorflow import trainer as tf_trainer
notes = {"reads": [], "keras": []}
calls = [None]
for name in ("__float__", "__int__", "__bool__", "__index__", "__array__", "__format__", "numpy"):
    def method(self, *a, _real=getattr(ops._EagerTensorBase, name), **k):
        if calls[0] is not None:
            caller = traceback.extract_stack(limit=2)[0]
            keras_own = caller.filename == tf_trainer.__file__ and "has_value" in (caller.line or "")
            notes["keras" if keras_own else "reads"].append(calls[0])
        return _real(self, *a, **k)
    setattr(ops._EagerTensorBase, name, method)
make_train_function = tf_trainer.TensorFlowTrainer.make_train_function
def counted(self, force=False):
    make_train_function(self, force)
    step = self.train_function
    def train_function(data):
        calls[0] = (calls[0] or 0) + 1
        return step(data)
    self.train_function = train_function
tf_trainer.TensorFlowTrainer.make_train_function = counted
import train
notes["result"] = train.main(sys.argv[2:])
print("NOTES " + json.dumps(notes))
"""


@pytest.fixture(scope="session")
def small(tmp_path_factory):
    """A small prepared corpus (made once for the run: conftest.built_once), and a way to train on it under a driver:
    (driver, output directory, backend, env) -> notes. The suite's JAX compilation cache (conftest) is inherited."""
    def build(root):
        corpus.generate(str(root / "c.txt"), 0.15, seed=1)
        summary = prepare.main(["--input", str(root / "c.txt"), "--output", str(root / "prep"), "--workers", "1",
                                "--vocab-size", "1000", "--max-seq-length", "32", "--max-predictions-per-seq", "5",
                                "--seed", "7"])
        (root / "summary.json").write_text(json.dumps(summary))
    root = built_once(tmp_path_factory, "steps-prep", build)
    summary = json.loads((root / "summary.json").read_text())
    env = dict(os.environ, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2",
               XLA_FLAGS=FAST_XLA_FLAGS)   # one CPU device
    for name in ("TF_USE_LEGACY_KERAS", "TPUCTL_OUTPUT_DIR", "TPUCTL_SESSION_DEADLINE", "TPUCTL_WORKER"):
        env.pop(name, None)

    def run(driver: str, out: Path, backend: str = "jax", **extra) -> dict:
        args = ["--data", f"{root}/prep/part-*.tfrecord", "--vocab-size", str(summary["vocab_size"]),
                "--preset", "tiny", "--seq-length", "32", "--max-predictions-per-seq", "5", "--batch-size", "4",
                "--steps", str(STEPS), "--log-every", str(EVERY), "--checkpoint-every", str(EVERY),
                "--deterministic", "--output", str(out)]
        r = subprocess.run([sys.executable, "-c", driver, str(JOB), *args], capture_output=True, text=True,
                           env={**env, "KERAS_BACKEND": backend, **extra}, timeout=600)
        assert r.returncode == 0 and "NOTES " in r.stdout, r.stderr[-3000:]
        notes = json.loads(r.stdout.split("NOTES ", 1)[1])
        lines = {int(ln.split()[1]): ln.split("examples/s")[0] for ln in r.stdout.splitlines()
                 if ln.startswith("step ")}
        return {**notes, "stdout": r.stdout, "lines": lines, "out": str(out)}
    return run


@pytest.fixture(scope="session")
def runs(small, tmp_path_factory):
    """An uninterrupted run of STEPS, and the same run stopped at its first log line (a notebook session ending:
    a checkpoint, exit 85) and started again; made once for the run whichever test asks first (conftest.built_once:
    their notes in runs.json, their outputs beside it). The runs after the first load the programs the first
    compiled from the suite's JAX compilation cache."""
    def build(root):
        whole = small(DRIVER, root / "whole")
        # the session's deadline passed long ago: the job stops at its first log line
        cut = small(DRIVER, root / "cut", TPUCTL_SESSION_DEADLINE="1")
        again = small(DRIVER, root / "cut")
        (root / "runs.json").write_text(json.dumps([whole, cut, again]))
    root = built_once(tmp_path_factory, "steps-runs", build)
    made = json.loads((root / "runs.json").read_text())
    for r in made:   # JSON's keys are strings: the step numbers of the printed lines back to ints
        r["lines"] = {int(k): v for k, v in r["lines"].items()}
        r["out"] = Path(r["out"])
    return made


@pytest.mark.slow(40)
def test_on_tensorflow_the_job_reads_the_device_only_at_the_steps_that_log_or_save(small, tmp_path):
    """The job's own reads on TensorFlow fall on the log and checkpoint steps alone, as on JAX. Keras's TensorFlow
    trainer adds one read per execution of --steps-per-execution steps (whether the dataset had a batch left): the
    job's default off TPU is one step per execution, so off TPU that read is per step; on a TPU (100 steps per
    execution) one in a hundred."""
    tf = small(TF_DRIVER, tmp_path / "tf", backend="tensorflow")
    assert tf["result"]["step"] == STEPS and sorted(tf["lines"]) == [4, 8, 12]
    assert sorted(set(tf["reads"])) == [4, 8, 12]
    assert tf["keras"] == list(range(1, STEPS + 1))


@pytest.mark.slow(60)   # the three runs of the module's fixture, whichever test comes first
def test_the_host_reads_the_device_only_at_the_steps_that_log_or_save(runs):
    """Keras's own CallbackList turns each batch's logs into floats, and the job read the optimizer's step after
    every batch: the host waited for each step before it could queue the next. Now only the log and checkpoint
    steps (every EVERY) read anything: STEPS / EVERY steps of STEPS."""
    whole, cut, again = runs
    assert sorted(set(whole["reads"])) == [4, 8, 12]
    assert sorted(set(cut["reads"])) == [4]
    assert sorted(set(again["reads"])) == [4, 8]   # the resumed run's calls 4 and 8: steps 8 and 12


@pytest.mark.slow(60)
def test_a_run_that_skips_loss_scale_steps_resumes_at_the_batch_it_stopped_and_ends_at_steps(runs):
    whole, cut, again = runs
    # the uninterrupted run: float16 steps were skipped, yet it ends at STEPS batches with its checkpoint there
    assert "mixed_float16" in whole["stdout"]
    assert whole["result"]["step"] == STEPS and whole["result"]["updates"] < STEPS
    assert [s for s, _ in whole["saved"]] == [4, 8, 12]
    assert sorted(whole["lines"]) == [4, 8, 12]
    # TensorBoard's learning rate is the optimizer's own (its schedule at its updates), not the schedule at the step
    assert whole["board"] == [[s, whole["lr"][u]] for s, u in whole["saved"]]
    assert any(whole["lr"][u] != whole["lr"][s] for s, u in whole["saved"])
    assert whole["made"][:STEPS] == list(range(STEPS))
    # stopped at step 4, where the optimizer had applied fewer updates than the batches it consumed
    assert cut["exit"] == 85 and "checkpoint at step 4" in cut["stdout"]
    [(step, updates)] = cut["saved"]
    assert step == 4 and updates < 4, cut["saved"]
    assert cut["made"][:4] == [0, 1, 2, 3]
    # resumed: reads on from batch 4, the batches the uninterrupted run read next, and ends as it did
    assert "resumed from step 4" in again["stdout"]
    assert again["made"][:STEPS - 4] == whole["made"][4:STEPS]
    assert again["result"]["step"] == STEPS and [s for s, _ in again["saved"]] == [8, 12]
    assert again["result"]["updates"] == whole["result"]["updates"]
    assert again["lines"] == {s: whole["lines"][s] for s in (8, 12)}   # every metric, to the printed digit
    assert sorted(p.name for p in (again["out"] / "checkpoints").glob("*.weights.h5")) == \
        ["ckpt-12.weights.h5", "ckpt-4.weights.h5", "ckpt-8.weights.h5"]
    metrics = json.loads((again["out"] / "metrics.json").read_text())
    assert metrics["step"] == STEPS and [a["from"] for a in metrics["attempts"]] == [0, 4]
