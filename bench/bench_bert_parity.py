"""Parity with the reference on either Keras backend: this job's Keras 3 BERT (on `--backend tensorflow` or `jax`)
against tf-models-official's BertEncoder + BertPretrainerV2 on tf-keras (TensorFlow), built as its MaskedLMTask
builds them (bench/tfm_reference.py), both in this one process, fed identical numpy batches from the job's
TF-free reader (records.Batches).

1. Forward parity: the reference's weights copied into ours (tfm_reference.MAPPING), dropout off, one held-out
   batch: parameter counts, and the max abs difference of the masked-LM and next-sentence logits and of the
   sequence output. Goal: the same parameters (apart from the reference encoder's pooler, which no loss reads), and
   differences < 1e-4.
2. Training: the same schedule, optimizer (AdamW as train.optimizer) and objective (MaskedLMTask.build_losses'
   terms), in turns of CHUNK steps so the machine's noise falls on both alike (who goes first alternates), once per
   seed; by default both start from the same weights (the reference's, copied), `--init own` gives each its own
   initialisation. Prints held-out masked-LM loss at every EVAL steps, averaged over the seeds, and the median
   examples/s of the turns. Goal: held-out MLM loss within 2% of the reference, examples/s >= the reference's.

    pip install --no-deps tf-models-official==2.20.0 && pip install sentencepiece gin-config scipy pyyaml tf-keras
    python bench/bench_bert_parity.py [--backend tensorflow|jax] [--steps 200] [--seeds 2] [--preset tiny]

Figures (2-core shared CPU, TF 2.21, Keras 3.15.1, JAX 0.10.2, tf-models-official 2.20.0): see docs/performance.md.
"""
import argparse
import os
import sys
import tempfile
import time
import warnings
from itertools import islice
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE.parent / "jobs" / "bert_pretrain"
BATCH, SEQ, PRED, CHUNK, EVAL, EVAL_BATCHES = 32, 128, 20, 50, 100, 30
NAMES = ("tf-models-official", "jobs/bert_pretrain")


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["tensorflow", "jax"], default=os.environ.get("KERAS_BACKEND", "tensorflow"),
                    help="Keras 3's backend for our model (default: KERAS_BACKEND, else tensorflow)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--init", choices=["copied", "own"], default="copied",
                    help="training starts from the reference's weights copied into ours, or from each one's own")
    return ap.parse_args(argv)


def data(tmp: Path, steps: int):
    """(vocabulary size, `steps` training batches, EVAL_BATCHES held-out batches), numpy, read once."""
    import corpus
    import prepare
    from records import Batches
    corpus.generate(str(tmp / "train.txt"), 2, seed=0)
    corpus.generate(str(tmp / "held.txt"), 0.3, seed=0, draw=1)
    s = prepare.main(["--input", str(tmp / "train.txt"), "--output", str(tmp / "train"), "--vocab-size", "8000"])
    prepare.main(["--input", str(tmp / "held.txt"), "--output", str(tmp / "held"),
                  "--vocab", str(tmp / "train" / "vocab.txt")])
    files = lambda d: sorted(str(p) for p in (tmp / d).glob("part-*.tfrecord"))   # noqa: E731
    train = list(islice(Batches(files("train"), BATCH, SEQ, PRED, seed=0), steps))
    held = list(islice(Batches(files("held"), BATCH, SEQ, PRED, training=False), EVAL_BATCHES))
    return s["vocab_size"], train, held


def stacked(batches):
    """A list of (x, y, w) batches as a tf.data.Dataset of the same batches."""
    import numpy as np
    import tensorflow as tf
    return tf.data.Dataset.from_tensor_slices(tuple({k: np.stack([b[i][k] for b in batches]) for k in batches[0][i]}
                                                    for i in range(3)))


def held_out(model, held) -> tuple:
    """(masked-LM loss over the real masked tokens, next-sentence accuracy) of a model on the held-out batches, the
    same numpy arithmetic for both models."""
    import numpy as np
    num = den = right = n = 0.0
    for x, y, w in held:
        out = model.predict_on_batch(x)
        logits = np.asarray(out["mlm"], np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        ce = -np.take_along_axis(logp, y["mlm"][..., None], -1)[..., 0]
        num, den = num + (ce * w["mlm"]).sum(), den + w["mlm"].sum()
        right, n = right + (np.asarray(out["nsp"]).argmax(-1) == y["nsp"][:, 0]).sum(), n + len(y["nsp"])
    return num / den, right / n


def forward_parity(config, held) -> None:
    import keras
    import numpy as np
    import tfm_reference as tfm
    from model import BertPretrainer, example_inputs
    ours, ref = BertPretrainer(config), tfm.reference(config)
    for m in (ours, ref):
        m(example_inputs(SEQ, PRED))
    tfm.copy_weights(ours, ref)
    x = held[0][0]
    d = tfm.differences(tfm.forward(ours, x), tfm.forward(ref, x), x["input_mask"])
    theirs, unread = int(sum(np.prod(v.shape) for v in ref.trainable_weights)), tfm.unread_params(ref)
    print(f"forward parity on {keras.backend.backend()}: parameters ours {ours.count_params()}, reference {theirs} "
          f"({theirs - unread} without its encoder's pooler_transform, which no loss reads): "
          f"{'equal' if ours.count_params() == theirs - unread else 'DIFFERENT'}; max |difference| on a held-out "
          f"batch of {BATCH} x {SEQ}, dropout off: MLM logits {d['mlm']:.2e}, NSP logits {d['nsp']:.2e}, "
          f"sequence output {d['sequence_output']:.2e} (goal < 1e-4)", flush=True)


def models(a, config, seed: int) -> dict:
    import keras
    import tf_keras
    import tfm_reference as tfm
    import train
    from model import BertPretrainer, example_inputs
    from tpuctl import runtime
    keras.utils.set_random_seed(seed)
    tf_keras.utils.set_random_seed(seed)
    ref, ours = tfm.reference(config), BertPretrainer(config)
    for m in (ref, ours):
        m(example_inputs(SEQ, PRED))
    if a.init == "copied":
        tfm.copy_weights(ours, ref)
    base_lr, at_batch = train.LEARNING_RATES[a.preset]
    warmup = max(1, a.steps // 10)   # train.py's default
    lr = runtime.schedule(base_lr, BATCH, at_batch, warmup, a.steps, rule="sqrt")
    # as train.py compiles on a CPU: XLA on JAX (its only mode), not on TensorFlow (no --jit)
    ours.compile(optimizer=train.optimizer(lr), jit_compile=keras.backend.backend() != "tensorflow")
    peak = runtime.scaled_lr(base_lr, BATCH, at_batch, rule="sqrt")
    ref.compile(optimizer=tfm.reference_optimizer(tfm.reference_schedule(peak, warmup, a.steps)))
    return dict(zip(NAMES, (ref, ours)))


def train_turn(name: str, m, batches, backend: str) -> None:
    """One turn's fit: tf.data where TensorFlow runs the model (the job's own pipeline there), a generator of the
    numpy batches on JAX (what the job's records.Batches is)."""
    feed = stacked(batches) if name == NAMES[0] or backend == "tensorflow" else (b for b in batches)
    m.fit(feed, epochs=1, steps_per_epoch=len(batches), verbose=0, shuffle=False)   # the batches are in order


def main(argv=None):
    a = parse(argv)
    os.environ["KERAS_BACKEND"] = a.backend   # before Keras is imported: it fixes its backend then
    os.environ.pop("TF_USE_LEGACY_KERAS", None)   # tf.keras stays Keras 3; the reference imports tf_keras itself
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # BertPretrainerV2 hands its encoder the masked positions too, which the encoder ignores, warning on every call
    warnings.filterwarnings("ignore", "Input dict contained keys")
    sys.path[:0] = [str(JOB), str(HERE), str(HERE.parent)]
    import numpy as np

    from model import BertConfig
    vocab, batches, held = data(Path(tempfile.mkdtemp()), a.steps)
    config = BertConfig.preset(a.preset, vocab)
    forward_parity(config, held)

    results = {name: {"curves": [], "rates": [], "cpu_rates": []} for name in NAMES}
    for seed in range(a.seeds):
        ms = models(a, config, seed)
        for name, m in ms.items():
            results[name]["params"] = int(sum(np.prod(v.shape) for v in m.trainable_weights))
            results[name]["curves"].append([])
        for at in range(0, a.steps, CHUNK):
            chunk = batches[at:at + CHUNK]
            # who goes first alternates: the CPU quota here tends to throttle whichever runs second in a turn
            for name, m in (list(ms.items()) if (at // CHUNK) % 2 else list(ms.items())[::-1]):
                t, cpu = time.perf_counter(), time.process_time()
                train_turn(name, m, chunk, a.backend)
                if at:   # the first turn traces and warms up: not timed
                    results[name]["rates"].append(len(chunk) * BATCH / (time.perf_counter() - t))
                    results[name]["cpu_rates"].append(len(chunk) * BATCH / (time.process_time() - cpu))
                if (at + len(chunk)) % EVAL == 0 or at + len(chunk) == a.steps:
                    results[name]["curves"][-1].append((at + len(chunk), *held_out(m, held)))
        print(f"seed {seed}: held-out MLM loss at step {a.steps}: "
              + "  ".join(f"{k} {r['curves'][-1][-1][1]:.4f}" for k, r in results.items()), flush=True)
    report(a, vocab, results)


def report(a, vocab: int, results: dict) -> None:
    import numpy as np
    print(f"\n{a.preset} BERT on Keras 3 / {a.backend} vs the reference on tf-keras / TensorFlow, batch {BATCH}, seq "
          f"{SEQ}, {a.steps} steps on identical batches (2 MB generated corpus, vocabulary {vocab}), {a.seeds} seeds, "
          f"initial weights {a.init}; held-out: {EVAL_BATCHES} batches of unseen documents; examples/s: median over "
          f"{CHUNK}-step turns, of wall time and of CPU time (this machine's CPU quota stretches some turns to twice "
          f"their wall time, whichever model runs)")
    steps = [c[0] for c in results[NAMES[1]]["curves"][0]]
    print(f"{'mean of the seeds':20s} {'params':>10s} " + " ".join(f"{'mlm@' + str(c):>9s}" for c in steps)
          + f" {'nsp_acc':>8s} {'examples/s':>11s} {'per CPU-s':>10s}")
    for name, r in results.items():
        curve = np.mean([[c[1] for c in curve] for curve in r["curves"]], axis=0)
        r["final"] = [curve[-1][1] for curve in r["curves"]]
        r["rate"], r["cpu_rate"] = float(np.median(r["rates"])), float(np.median(r["cpu_rates"]))
        nsp = np.mean([curve[-1][2] for curve in r["curves"]])
        print(f"{name:20s} {r['params']:10d} " + " ".join(f"{v:9.4f}" for v in curve)
              + f" {nsp:8.4f} {r['rate']:11.1f} {r['cpu_rate']:10.1f}")
    ours, ref = results[NAMES[1]], results[NAMES[0]]
    gap = (np.mean(ours["final"]) - np.mean(ref["final"])) / np.mean(ref["final"])
    print(f"held-out MLM loss at {a.steps}: ours {np.mean(ours['final']):.4f} (seeds {min(ours['final']):.4f}-"
          f"{max(ours['final']):.4f}), reference {np.mean(ref['final']):.4f} ({min(ref['final']):.4f}-"
          f"{max(ref['final']):.4f}): {gap:+.1%} (goal within 2%); speed {ours['rate'] / ref['rate']:.2f}x the "
          f"reference in wall time, {ours['cpu_rate'] / ref['cpu_rate']:.2f}x in CPU time (goal >= 1)")


if __name__ == "__main__":
    main()
