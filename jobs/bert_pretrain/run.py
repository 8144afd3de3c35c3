"""The job's entry point (tpuctl.toml runs it): prepare the data (skipped when cached), then train.

    python run.py [--corpus FILE_OR_GLOB] [--vocab-size N] [train.py flags, e.g. --preset tiny --steps 30]

The corpus is --corpus, else the *.txt files synced to $TPUCTL_DATA_DIR (tpuctl submit --data my_corpus.txt),
else a small generated Hangul/Latin sample, so the job runs offline. Prepared shards live in
$TPUCTL_STORE/prepared/bert_pretrain-SEQ/ (the cluster's bucket on a TPU), shared by later runs.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv=None):
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--vocab-size", type=int, default=None)
    ap.add_argument("--sample-mb", type=float, default=2.0)
    ap.add_argument("--seq-length", type=int, default=128)
    ap.add_argument("--max-predictions-per-seq", type=int, default=20)
    a, train_args = ap.parse_known_args(argv)
    data_dir = os.environ.get("TPUCTL_DATA_DIR", "")
    if a.corpus:
        corpus = [a.corpus]
    elif data_dir and not data_dir.startswith("gs://") and glob.glob(os.path.join(data_dir, "*.txt")):
        corpus = [os.path.join(data_dir, "*.txt")]
    elif data_dir.startswith("gs://"):
        import tensorflow as tf  # only on the cloud path: gfile reads gs://
        remote = tf.io.gfile.glob(f"{data_dir}/*.txt")
        local = tempfile.mkdtemp(prefix="corpus-")
        for r in remote:
            tf.io.gfile.copy(r, os.path.join(local, os.path.basename(r)), overwrite=True)
        corpus = [os.path.join(local, "*.txt")] if remote else []
    else:
        corpus = []
    if not corpus:
        from corpus import generate
        path = os.path.join(tempfile.gettempdir(), f"bert-sample-{a.sample_mb}mb.txt")
        if not os.path.exists(path):
            generate(path, a.sample_mb, seed=0)
        print(f"run: no corpus given; using a generated {a.sample_mb} MB Hangul/Latin sample", flush=True)
        corpus = [path]
        vocab_size = a.vocab_size or 8000
    else:
        vocab_size = a.vocab_size or 30000
    store = os.environ.get("TPUCTL_STORE") or os.path.join(HERE, ".tpuctl-cache")
    prepared = f"{store.rstrip('/')}/prepared/bert_pretrain-{a.seq_length}"
    import prepare
    summary = prepare.main(["--input", *corpus, "--output", prepared, "--vocab-size", str(vocab_size),
                            "--max-seq-length", str(a.seq_length),
                            "--max-predictions-per-seq", str(a.max_predictions_per_seq)])
    import train
    train.main(["--data", f"{prepared}/part-*.tfrecord", "--vocab-size", str(summary["vocab_size"]),
                "--seq-length", str(a.seq_length), "--max-predictions-per-seq", str(a.max_predictions_per_seq),
                *train_args])


if __name__ == "__main__":
    main()
