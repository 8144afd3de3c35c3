"""Fine-tune a sentence classifier on a pretrained encoder (export.py's encoder.keras), or on a randomly
initialised one of the same shape for comparison:

    python finetune.py --encoder EXPORT/encoder.keras --vocab PREPARED/vocab.txt
    python finetune.py --random-init --preset tiny --vocab PREPARED/vocab.txt

The task is --data (a TSV of `label<TAB>sentence` lines; a tenth held out), or, without it, one generated from
the sample corpus's language (corpus.labelled: sentences labelled by their topic), so it runs offline. The
classifier is the encoder's pooled output, dropout, and one dense layer; prints held-out accuracy.
"""
from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def encode(tok, sentences: list[str], seq: int):
    """[CLS] tokens [SEP], padded to `seq`: the inputs BertEncoder takes."""
    import numpy as np

    from prepare import CLS, SEP, tokenize
    ids = np.zeros((len(sentences), seq), np.int32)
    for i, toks in enumerate(tokenize(tok, sentences)):
        row = [CLS, *toks[:seq - 2], SEP]
        ids[i, :len(row)] = row
    return {"input_ids": ids, "input_mask": (ids != 0).astype(np.int32), "segment_ids": np.zeros_like(ids)}


def classifier(encoder, classes: int, dropout: float = 0.1, pooling: str = "cls"):
    """pooling "cls": BERT's pooled output (the [CLS] position through the pooler, which pretraining shapes only
    through next-sentence prediction); "mean": the mean of the sequence output over the real tokens."""
    import keras
    from keras import ops
    inputs = {k: keras.Input([None], dtype="int32", name=k) for k in ("input_ids", "input_mask", "segment_ids")}
    out = encoder(inputs)
    if pooling == "mean":
        real = ops.cast(inputs["input_mask"], out["sequence_output"].dtype)[:, :, None]
        pooled = ops.sum(out["sequence_output"] * real, 1) / ops.maximum(ops.sum(real, 1), 1.0)
    else:
        pooled = out["pooled_output"]
    logits = keras.layers.Dense(classes, name="classifier")(keras.layers.Dropout(dropout)(pooled))
    return keras.Model(inputs, logits)


def load_task(path: str | None, classes: int, n: int, language: int = 0, held_out: int = 1000):
    """(sentences, labels) for training and for evaluation: a tenth of --data held out, or `n` generated examples
    to train on and `held_out` more to evaluate."""
    if path:
        rows = [line.rstrip("\n").split("\t", 1) for line in open(path, encoding="utf-8") if "\t" in line]
        labels, sentences = [int(r[0]) for r in rows], [r[1] for r in rows]
    else:
        from corpus import labelled
        sentences, labels = labelled(n + held_out, classes, seed=language)
        return (sentences[:n], labels[:n]), (sentences[n:], labels[n:])
    cut = len(sentences) * 9 // 10
    return (sentences[:cut], labels[:cut]), (sentences[cut:], labels[cut:])


def batches(x: dict, y, size: int, seed: int):
    """Shuffled batches, pass after pass (each pass its own seeded order), on any backend."""
    import numpy as np
    for p in range(1 << 30):
        order = np.random.default_rng([seed, p]).permutation(len(y))
        for i in range(0, len(y) - size + 1, size):
            idx = order[i:i + size]
            yield {k: v[idx] for k, v in x.items()}, y[idx]


def seed_all(value: int) -> None:
    """keras.utils.set_random_seed, less its TensorFlow import on JAX where TensorFlow is installed (a Colab or
    Kaggle image; this machine's tests: about 5 s of start-up), as train.py seeds: tpuctl.runtime.seed where tpuctl
    is importable (a host tpuctl runs the job on), Keras's own elsewhere. Each fine-tuning builds its classifier
    afresh after it, so every initializer and dropout draws its seed from the seeded Python random."""
    try:
        from tpuctl import runtime
    except ImportError:
        import keras
        keras.utils.set_random_seed(value)
        return
    runtime.seed(value)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoder", help="encoder.keras from export.py")
    ap.add_argument("--random-init", action="store_true", help="a fresh encoder of --preset instead (a baseline)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--vocab", required=True, help="the vocab.txt the encoder was pretrained with")
    ap.add_argument("--data", default=None, help="TSV of label<TAB>sentence (default: a generated task)")
    ap.add_argument("--classes", type=int, default=4, help="generated task: topics to tell apart")
    ap.add_argument("--examples", type=int, default=40,
                    help="generated examples to train on (a few-shot task, where pretraining shows; 1000 more are "
                         "held out)")
    ap.add_argument("--language-seed", type=int, default=0,
                    help="the generated task's language: the seed its pretraining corpus was generated with")
    ap.add_argument("--seq-length", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--learning-rate", type=float, default=5e-4)
    ap.add_argument("--pooling", choices=["cls", "mean"], default="cls")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="fine-tune this many times (seeds SEED...) and average")
    a = ap.parse_args(argv)
    if bool(a.encoder) == a.random_init:
        ap.error("give --encoder PATH or --random-init")
    import keras
    import numpy as np

    import losses
    import model as bert
    from prepare import build_tokenizer, read_vocab
    tok = build_tokenizer(a.vocab, lower_case=False)
    (train_x, train_y), (test_x, test_y) = load_task(a.data, a.classes, a.examples, a.language_seed)
    x, y = encode(tok, train_x, a.seq_length), np.array(train_y)
    held = encode(tok, test_x, a.seq_length), np.array(test_y)
    classes = max(max(train_y), max(test_y)) + 1
    runs = []
    for seed in range(a.seed, a.seed + a.repeats):   # fine-tuning on few examples varies with the seed: average
        seed_all(seed)
        encoder = keras.saving.load_model(a.encoder) if a.encoder else \
            bert.BertEncoder(bert.BertConfig.preset(a.preset, len(read_vocab(a.vocab))))
        net = classifier(encoder, classes, pooling=a.pooling)
        net.compile(optimizer=keras.optimizers.Adam(a.learning_rate),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        losses.build(net, {k: v[:1] for k, v in x.items()}, y[:1])
        net.fit(batches(x, y, a.batch_size, seed), steps_per_epoch=a.steps, epochs=1, verbose=0)
        runs.append(net.evaluate(*held, verbose=0))
    loss, acc = (float(v) for v in np.mean(runs, axis=0))
    print(f"finetune: {'pretrained' if a.encoder else 'random-init'} encoder, {a.steps} steps, {a.repeats} seed(s): "
          f"held-out accuracy {acc:.4f}, loss {loss:.4f} ({len(test_y)} examples)", flush=True)
    return {"accuracy": acc, "loss": loss}

if __name__ == "__main__":
    main()
