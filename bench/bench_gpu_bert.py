"""Issue 50's GPU check, ready for a session lent a device: BERT sequences/s of jobs/bert_pretrain (train.py, the
loop tpuctl's agent runs: the agent adds no work to a step) against a plain Keras 3 BERT probe on the same card,
in one run. The probe is the one in ../shared/BERT_NOTES.md "Measured on a GPU": post-LN encoder, GELU, an untied
masked-LM head and NSP, `train_on_batch` on synthetic tokens (which waits for each step's loss: a floor). Both
take the policy the job's runtime picks (mixed_bfloat16 on a GPU of compute capability >= 8.0, float32 on a CPU),
the same batch, sequence and masked positions. Goal (issue 50): the job >= 0.9x the probe, BERT-base, seq 128.

    KERAS_BACKEND=jax python bench/bench_gpu_bert.py                        # BERT-base, batch 128, on the GPU
    KERAS_BACKEND=jax python bench/bench_gpu_bert.py --preset tiny --batch 32 --steps 40 --corpus-mb 2  # on a CPU

Needs keras, tokenizers and numpy beside JAX (prepare.py trains the WordPiece vocabulary); no TensorFlow, and no
tpuctl installed (the repository's own tpuctl.runtime is put on PYTHONPATH). The device machine's image has JAX and
no Keras: carry a wheelhouse made here for its Python (`pip download -d wheelhouse --python-version 3.X
--only-binary :all: keras tokenizers google-crc32c`) and install it there (`pip install --no-index -f wheelhouse
keras tokenizers google-crc32c`). Each side runs in its own process (one device, one backend each), the job first.
Measured on this 2-core CPU (tiny, batch 32, 40 steps; a check of the script, not of the goal): job 92 sequences/s,
probe 65 (1.42x).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = Path(__file__).resolve().parent.parent / "jobs" / "bert_pretrain"
ROOT = JOB.parent.parent

# The probe, run as its own process: argv[1] is a JSON of its settings; prints its sequences/s.
PROBE = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
sys.path.insert(0, cfg["root"])
import numpy as np
import keras
from keras import layers, ops
from tpuctl import runtime
replicas = runtime.strategy()
policy = runtime.mixed_precision(runtime.kind(replicas))
L, H, A, F = cfg["shape"]
V, S, P, B = cfg["vocab"], cfg["seq"], cfg["preds"], cfg["batch"]
ids, seg, pos_ids, masked = (keras.Input((S,), dtype="int32"), keras.Input((S,), dtype="int32"),
                             keras.Input((S,), dtype="int32"), keras.Input((P,), dtype="int32"))
x = layers.Embedding(V, H)(ids) + layers.Embedding(2, H)(seg) + layers.Embedding(S, H)(pos_ids)
x = layers.Dropout(0.1)(layers.LayerNormalization(epsilon=1e-12)(x))
for _ in range(L):
    a = layers.MultiHeadAttention(A, H // A, dropout=0.1)(x, x)
    x = layers.LayerNormalization(epsilon=1e-12)(x + layers.Dropout(0.1)(a))
    f = layers.Dense(H)(layers.Dense(F, activation="gelu")(x))
    x = layers.LayerNormalization(epsilon=1e-12)(x + layers.Dropout(0.1)(f))
picked = ops.take_along_axis(x, ops.expand_dims(masked, -1), axis=1)
mlm = layers.Dense(V, dtype="float32")(layers.LayerNormalization(epsilon=1e-12)(
    layers.Dense(H, activation="gelu")(picked)))
nsp = layers.Dense(2, dtype="float32")(layers.Dense(H, activation="tanh")(x[:, 0]))
model = keras.Model([ids, seg, pos_ids, masked], [mlm, nsp])
model.compile(optimizer=keras.optimizers.AdamW(1e-4),
              loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True)] * 2)
rng = np.random.default_rng(0)
batch = [rng.integers(0, V, (B, S), dtype="int32"), rng.integers(0, 2, (B, S), dtype="int32"),
         np.tile(np.arange(S, dtype="int32"), (B, 1)), rng.integers(0, S, (B, P), dtype="int32")]
labels = [rng.integers(0, V, (B, P), dtype="int32"), rng.integers(0, 2, (B,), dtype="int32")]
for _ in range(cfg["warmup"]):
    model.train_on_batch(batch, labels)
t = time.perf_counter()
for _ in range(cfg["steps"]):
    model.train_on_batch(batch, labels)
took = time.perf_counter() - t
print("PROBE " + json.dumps({"seq_per_s": cfg["steps"] * B / took, "policy": policy,
                             "params": model.count_params()}))
"""


def _prepare(tmp: Path, megabytes: float, seq: int, preds: int) -> dict:
    sys.path.insert(0, str(JOB))
    import corpus
    import prepare
    corpus.generate(str(tmp / "c.txt"), megabytes, seed=0)
    return prepare.main(["--input", str(tmp / "c.txt"), "--output", str(tmp / "prep"), "--vocab-size", "30522",
                         "--max-seq-length", str(seq), "--max-predictions-per-seq", str(preds),
                         "--workers", str(min(8, os.cpu_count() or 1))])


def _job(a: argparse.Namespace, tmp: Path, vocab: int, env: dict) -> tuple[float, str]:
    """The job's examples/s over its last log interval (compiled and warm), and its start line."""
    every = max(1, a.steps // 4)
    r = subprocess.run([sys.executable, str(JOB / "train.py"), "--data", f"{tmp}/prep/part-*.tfrecord",
                        "--vocab-size", str(vocab), "--preset", a.preset, "--batch-size", str(a.batch),
                        "--seq-length", str(a.seq), "--max-predictions-per-seq", str(a.preds),
                        "--steps", str(a.steps), "--log-every", str(every),
                        "--checkpoint-every", str(a.steps * 10), "--output", str(tmp / "out")],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"train.py failed ({r.returncode}):\n{r.stderr[-3000:]}")
    lines = r.stdout.splitlines()
    rates = [float(ln.rsplit("examples/s", 1)[1]) for ln in lines if ln.startswith("step ")]
    return rates[-1], next((ln for ln in lines if ln.startswith("bert: ")), "")


def _probe(a: argparse.Namespace, vocab: int, env: dict) -> dict:
    sys.path.insert(0, str(JOB))
    from model import PRESETS
    cfg = {"root": str(ROOT), "shape": PRESETS[a.preset], "vocab": vocab, "seq": a.seq, "preds": a.preds,
           "batch": a.batch, "warmup": 5, "steps": a.probe_steps}
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cfg)], capture_output=True, text=True, env=env)
    if r.returncode or "PROBE " not in r.stdout:
        raise SystemExit(f"the probe failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.split("PROBE ", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="base")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--preds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200, help="the job's steps; its last quarter is what counts")
    ap.add_argument("--probe-steps", type=int, default=50)
    ap.add_argument("--corpus-mb", type=float, default=8.0)
    a = ap.parse_args()
    env = dict(os.environ, KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "jax"), TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("TPUCTL_OUTPUT_DIR", None)
    tmp = Path(tempfile.mkdtemp(prefix="bench-gpu-bert-"))
    t = time.perf_counter()
    vocab = int(_prepare(tmp, a.corpus_mb, a.seq, a.preds)["vocab_size"])
    print(f"prepared {a.corpus_mb:g} MB of corpus in {time.perf_counter() - t:.0f}s (vocab {vocab})", flush=True)
    job, said = _job(a, tmp, vocab, env)
    print(f"job   : {job:9.1f} sequences/s   ({said})", flush=True)
    probe = _probe(a, vocab, env)
    print(f"probe : {probe['seq_per_s']:9.1f} sequences/s   ({probe['policy']}, {probe['params']:,} parameters)")
    ratio = job / probe["seq_per_s"]
    print(f"job / probe = {ratio:.2f} (goal >= 0.90: {'met' if ratio >= 0.9 else 'NOT met'}); "
          f"{a.preset}, batch {a.batch}, seq {a.seq}, backend {env['KERAS_BACKEND']}")


if __name__ == "__main__":
    main()
