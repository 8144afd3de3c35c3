"""The BERT job's JAX-backend reader (jobs/bert_pretrain/records.py over fixedrows.py's rows) against tf.data on the
same TFRecord shards, in one run, on one core; batch 128, sequence 128, 20 predictions (the issue's setting):

1. sequences/s with dynamic masks (the default), with prepare.py's static masks, and the old reader's per-record
   protobuf decode (fixedrows.decode, what a shard without its rows costs), against tf.data parsing the same
   shards with one thread (goal: >= 20,000 sequences/s per host);
2. a resume deep into the data: time to the first batch after skipping SKIP batches, against tf.data's skip of the
   same number (which reads every skipped record).

    python bench/bench_reader.py [CORPUS_MB] [SKIP]
"""
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "jobs", "bert_pretrain")
sys.path.insert(0, JOB)

import corpus  # noqa: E402
import data  # noqa: E402
import fixedrows  # noqa: E402
import masking  # noqa: E402
import prepare  # noqa: E402
import records  # noqa: E402

CORPUS_MB = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
SKIP = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
BATCH, SEQ, PRED, VOCAB = 128, 128, 20, 8000


def rate(batches, seconds: float) -> float:
    return batches * BATCH / seconds


def ours(files, masks, n: int) -> float:
    """Batches made on the calling thread only: one core's worth."""
    r = records.Batches(files, BATCH, SEQ, PRED, seed=1, masks=masks)
    r.make(0)   # the first pass's order
    t = time.perf_counter()
    for b in range(1, n + 1):
        r.make(b)
    return rate(n, time.perf_counter() - t)


def main():
    tmp = tempfile.mkdtemp(prefix="bench-reader-")
    text, out = os.path.join(tmp, "c.txt"), os.path.join(tmp, "prep")
    corpus.generate(text, CORPUS_MB, seed=0)
    summary = prepare.main(["--input", text, "--output", out, "--vocab-size", str(VOCAB), "--max-seq-length",
                            str(SEQ), "--max-predictions-per-seq", str(PRED), "--chunk-mb", "1"])
    pattern = f"{out}/part-*.tfrecord"
    files = data.shards(pattern)
    masks = records.Masks(masking.specials_of(prepare.read_vocab(f"{out}/vocab.txt")), 0.15, summary["vocab_size"])
    per_pass = summary["examples"] // BATCH
    n = min(300, per_pass * 3)

    import tensorflow as tf
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = 1
    ds = data.tf_dataset(pattern, BATCH, SEQ, PRED, seed=1).with_options(opts)
    it = iter(ds)
    next(it)
    t = time.perf_counter()
    for _ in range(n):
        next(it)
    theirs = rate(n, time.perf_counter() - t)

    dynamic, static = ours(files, masks, n), ours(files, None, n)
    t = time.perf_counter()
    decoded = sum(len(fixedrows.decode(f, SEQ, PRED)) for f in files[:2])
    old = decoded / (time.perf_counter() - t)
    print(f"{summary['examples']} sequences in {len(files)} shards, batch {BATCH}, seq {SEQ}, one core:")
    print(f"  tf.data, one thread (static masks)  : {theirs:9.0f} sequences/s")
    print(f"  records.Batches, dynamic masks      : {dynamic:9.0f} sequences/s  {dynamic / theirs:5.2f}x tf.data "
          f"(goal >= 20,000/s)")
    print(f"  records.Batches, static masks       : {static:9.0f} sequences/s  {static / theirs:5.2f}x tf.data")
    print(f"  per-record protobuf decode (old)    : {old:9.0f} sequences/s  {old / theirs:5.2f}x tf.data")

    t = time.perf_counter()
    next(iter(records.Batches(files, BATCH, SEQ, PRED, seed=1, masks=masks, skip=SKIP)))
    seek = time.perf_counter() - t
    tf_skip = min(SKIP, 2 * per_pass)   # tf.data reads what it skips: a bounded share, scaled up below
    t = time.perf_counter()
    next(iter(data.tf_dataset(pattern, BATCH, SEQ, PRED, seed=1, skip=tf_skip).with_options(opts)))
    tf_seek = (time.perf_counter() - t) * SKIP / tf_skip
    print(f"resume at batch {SKIP} ({SKIP * BATCH} sequences, {SKIP / max(1, per_pass):.0f} passes in):")
    print(f"  records.Batches seek                : {seek:9.2f} s to the first batch")
    print(f"  tf.data skip (x{SKIP / tf_skip:.0f} of {tf_skip} batches): {tf_seek:9.2f} s  "
          f"({tf_seek / seek:.0f}x the seek)")


if __name__ == "__main__":
    main()
