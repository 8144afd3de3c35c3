"""Parity with the reference: this job's BERT against tf-models-official's (BertEncoder + BertPretrainerV2, built as
its MaskedLMTask builds them) of the same size, trained on identical batches with the same schedule, optimizer and
objective (losses.PretrainingModel, whose terms are MaskedLMTask.build_losses'), in turns of CHUNK steps so the
machine's noise falls on both alike, once per initialisation seed (one run of a small model says little: its loss
plateaus and drops at a different step for each seed). Prints held-out masked-LM loss at every EVAL steps, averaged
over the seeds, and the median examples/s of the turns, side by side.
Goal: held-out MLM loss within 2% of the reference, examples/s >= the reference's.

    pip install --no-deps tf-models-official==2.20.0 && pip install sentencepiece gin-config scipy pyyaml
    python bench/bench_bert_parity.py [STEPS] [SEEDS] [PRESET]      # default 400 3 tiny
"""
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
JOB = Path(__file__).resolve().parent.parent / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))
sys.path.insert(0, str(JOB.parent.parent))
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 400
SEEDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
PRESET = sys.argv[3] if len(sys.argv) > 3 else "tiny"
NAMES = ("tf-models-official", "jobs/bert_pretrain")
BATCH, SEQ, PRED, CHUNK, EVAL, EVAL_BATCHES = 32, 128, 20, 50, 100, 30


def reference(vocab_size: int):
    """tf-models-official's pretrainer, as official/nlp/tasks/masked_lm.py MaskedLMTask.build_model makes it from
    the default BertEncoderConfig (gelu, truncated normal 0.02, type vocabulary 2, 512 positions) with one
    next-sentence ClassificationHead, behind this job's input and output names."""
    import tensorflow as tf
    import tf_keras
    from losses import PretrainingModel
    from model import PRESETS
    from official.modeling import tf_utils
    from official.nlp.modeling import layers, models, networks
    n_layers, hidden, heads, inter = PRESETS[PRESET]
    init = lambda: tf_keras.initializers.TruncatedNormal(stddev=0.02)   # noqa: E731
    encoder = networks.BertEncoder(
        vocab_size=vocab_size, hidden_size=hidden, num_layers=n_layers, num_attention_heads=heads,
        intermediate_size=inter, activation=tf_utils.get_activation("gelu"), dropout_rate=0.1,
        attention_dropout_rate=0.1, max_sequence_length=512, type_vocab_size=2, initializer=init(),
        dict_outputs=True)
    net = models.BertPretrainerV2(
        encoder_network=encoder, mlm_activation=tf_utils.get_activation("gelu"), mlm_initializer=init(),
        classification_heads=[layers.ClassificationHead(inner_dim=hidden, num_classes=2, dropout_rate=0.1,
                                                        name="next_sentence")])

    class Reference(PretrainingModel):
        def __init__(self):
            super().__init__(name="reference")
            self.net = net

        def call(self, f, training=False):
            out = self.net({"input_word_ids": f["input_ids"], "input_mask": f["input_mask"],
                            "input_type_ids": f["segment_ids"], "masked_lm_positions": f["masked_lm_positions"]},
                           training=training)
            return {"mlm": tf.cast(out["mlm_logits"], tf.float32), "nsp": tf.cast(out["next_sentence"], tf.float32)}
    return Reference()


def ours(vocab_size: int):
    from model import BertConfig, BertPretrainer
    return BertPretrainer(BertConfig.preset(PRESET, vocab_size))


def main():
    import numpy as np
    import tensorflow as tf

    import corpus
    import prepare
    import train
    from data import dataset
    from model import example_inputs
    from tpuctl import runtime
    tmp = Path(tempfile.mkdtemp())
    corpus.generate(str(tmp / "train.txt"), 2, seed=0)
    corpus.generate(str(tmp / "held.txt"), 0.3, seed=0, draw=1)
    s = prepare.main(["--input", str(tmp / "train.txt"), "--output", str(tmp / "train"), "--vocab-size", "8000"])
    prepare.main(["--input", str(tmp / "held.txt"), "--output", str(tmp / "held"),
                  "--vocab", str(tmp / "train" / "vocab.txt")])
    # identical batches for both: read once, kept in memory
    batches = dataset(f"{tmp / 'train'}/part-*.tfrecord", BATCH, SEQ, PRED, seed=0).take(STEPS).cache()
    held = dataset(f"{tmp / 'held'}/part-*.tfrecord", BATCH, SEQ, PRED, training=False).take(EVAL_BATCHES).cache()
    for _ in batches.concatenate(held):
        pass

    results = {name: {"curves": [], "rates": [], "cpu_rates": []} for name in NAMES}
    for seed in range(SEEDS):
        models = {}
        for name, make in zip(NAMES, (reference, ours)):
            tf.keras.utils.set_random_seed(seed)
            m = make(s["vocab_size"])
            m(example_inputs(SEQ, PRED))
            base_lr, at_batch = train.LEARNING_RATES[PRESET]
            lr = runtime.schedule(base_lr, BATCH, at_batch, max(1, STEPS // 10), STEPS, rule="sqrt")   # train.py's
            m.compile(optimizer=train.optimizer(lr), weighted_metrics=[])
            models[name] = m
            results[name]["params"] = int(sum(np.prod(v.shape) for v in m.trainable_variables))
            results[name]["curves"].append([])
        for at in range(0, STEPS, CHUNK):
            n = min(CHUNK, STEPS - at)
            # who goes first alternates: the CPU quota here tends to throttle whichever runs second in a turn
            for name, m in (list(models.items()) if (at // CHUNK) % 2 else list(models.items())[::-1]):
                t, cpu = time.perf_counter(), time.process_time()
                m.fit(batches.skip(at).take(n).prefetch(2), epochs=1, steps_per_epoch=n, verbose=0)
                if at:   # the first turn traces and warms up: not timed
                    results[name]["rates"].append(n * BATCH / (time.perf_counter() - t))
                    results[name]["cpu_rates"].append(n * BATCH / (time.process_time() - cpu))
                if (at + n) % EVAL == 0 or at + n == STEPS:
                    e = m.evaluate(held, verbose=0, return_dict=True)
                    results[name]["curves"][-1].append((at + n, e["mlm_loss"], e["nsp_acc"]))
        print(f"seed {seed}: held-out MLM loss at step {STEPS}: "
              + "  ".join(f"{k} {r['curves'][-1][-1][1]:.4f}" for k, r in results.items()), flush=True)

    print(f"\n{PRESET} BERT, batch {BATCH}, seq {SEQ}, {STEPS} steps on identical batches (2 MB generated corpus, "
          f"vocabulary {s['vocab_size']}), {SEEDS} initialisation seeds; held-out: {EVAL_BATCHES} batches of unseen "
          f"documents; examples/s: median over {CHUNK}-step turns, of wall time and of CPU time (this machine's "
          f"CPU quota stretches some turns to twice their wall time, whichever model runs)")
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
    a, b = results[NAMES[1]], results[NAMES[0]]
    gap = (np.mean(a["final"]) - np.mean(b["final"])) / np.mean(b["final"])
    print(f"held-out MLM loss at {STEPS}: ours {np.mean(a['final']):.4f} (seeds {min(a['final']):.4f}-"
          f"{max(a['final']):.4f}), reference {np.mean(b['final']):.4f} ({min(b['final']):.4f}-{max(b['final']):.4f}): "
          f"{gap:+.1%} (goal within 2%); speed {a['rate'] / b['rate']:.2f}x the reference in wall time, "
          f"{a['cpu_rate'] / b['cpu_rate']:.2f}x in CPU time (goal >= 1)")


if __name__ == "__main__":
    main()
