"""jobs/bert_pretrain writing its outputs to gs:// on JAX hosts, as found running it on tpuctl's simulated two-host
slice (test_bert_on_sim_hosts.py): the weights every host builds, and TensorBoard's events without TensorFlow.

The same initial weights on every host of a run, whatever the chief alone did before: across hosts only process 0
writes the run's files (train.describe), and a write to gs:// draws from Python's random (google-resumable-media's
multipart boundary: _upload.py get_boundary, random.randrange), from which every unseeded Keras initializer and
dropout seed is drawn too (keras/src/random/seed_generator.py make_default_seed). Seeded before those writes, the
two hosts of a slice built different weights and JAX refused them ("... passed to device_put is not the same on
each process"). Here in one JAX process: the weights built after the chief's writes drew from Python's random (as
many draws as a few uploads) equal those built after none."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_XLA_FLAGS

JOB = Path(__file__).parent.parent / "jobs" / "bert_pretrain"
# train.main twice, with the run's description (the chief's writes) drawing `n` numbers from Python's random; the
# model's weights after each, hashed; --steps 0 returns once the model is built
PROBE = """
import hashlib, random, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import model, train
made = []
real_model, real_describe = model.BertPretrainer, train.describe
model.BertPretrainer = lambda *a, **k: made.append(real_model(*a, **k)) or made[-1]
for n in map(int, sys.argv[3:]):
    train.describe = lambda *a, n=n: (real_describe(*a), [random.random() for _ in range(n)])
    train.main(["--data", f"{sys.argv[2]}/none/part-*.tfrecord", "--vocab-size", "64", "--preset", "tiny",
                "--steps", "0", "--seq-length", "16", "--max-predictions-per-seq", "2", "--output", sys.argv[2]])
    print("weights", n, hashlib.sha1(b"".join(np.asarray(w).tobytes() for w in made[-1].weights)).hexdigest())
"""


@pytest.mark.slow(30)
def test_the_chiefs_writes_do_not_change_the_weights_it_builds(tmp_path):
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env["XLA_FLAGS"] = FAST_XLA_FLAGS   # one CPU device
    env.pop("TF_USE_LEGACY_KERAS", None)
    r = subprocess.run([sys.executable, "-c", PROBE, str(JOB), str(tmp_path), "3", "0"], env=env, text=True,
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    weights = dict(line.split()[1:] for line in r.stdout.splitlines() if line.startswith("weights "))
    assert len(weights) == 2 and weights["3"] == weights["0"], weights


def test_tensorboard_events_reach_gs_on_jax_without_tensorflow(tmp_path, monkeypatch):
    """On JAX a gs:// log directory has no file system but TensorFlow's, and none on a host without TensorFlow (a TPU
    VM on a base runtime, Compute Engine's TPU image): TensorBoard's TF-free stub hands it to fsspec, which wants
    gcsfs. The events are written locally and copied there through the job's store client (fileio) at each flush."""
    sys.path.insert(0, str(JOB))
    import callbacks
    import fileio
    bucket = tmp_path / "bucket"
    copied = []

    def copy(src, dst):
        assert dst.startswith("gs://b/")
        copied.append(dst)
        (bucket / dst.removeprefix("gs://b/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, bucket / dst.removeprefix("gs://b/"))
    monkeypatch.setitem(sys.modules, "tensorboard.compat.notf", type(sys)("tensorboard.compat.notf"))
    monkeypatch.setattr(fileio, "copy", copy)
    board = callbacks.Board("gs://b/run/tensorboard/train", "jax")
    board.write({"loss": 7.5}, 2)
    board.write({"loss": 6.25}, 4)
    [event] = list((bucket / "run/tensorboard/train").iterdir())
    assert event.name.startswith("events.out.tfevents.") and len(set(copied)) == 1
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    values = [(e.step, v.tag, v.tensor.float_val or v.simple_value) for e in EventFileLoader(str(event)).Load()
              for v in e.summary.value]
    assert [(s, t) for s, t, _ in values] == [(2, "loss"), (4, "loss")], values
