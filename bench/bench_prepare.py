"""BERT data preparation: jobs/bert_pretrain/prepare.py against the reference shipped in tf-models-official
(official/nlp/data/create_pretraining_data.py) on the same generated corpus, vocabulary and options. The two run in
turns, ROUNDS times; the speed-up printed is the median of the rounds' ratios (the machine is shared and noisy, so
one pair of runs says little). Then the statistics of both outputs side by side: instances per MB, mean real tokens
per instance, masked tokens per instance, the random-next-sentence rate. Goal: >= 15x on 2 cores.

    pip install --no-deps tf-models-official==2.20.0 && pip install sentencepiece gin-config scipy pyyaml
    python bench/bench_prepare.py [MB] [ROUNDS]      # default 21 MB, 5 rounds
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from statistics import median
from pathlib import Path

JOB = Path(__file__).resolve().parent.parent / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))
MB = float(sys.argv[1]) if len(sys.argv) > 1 else 21.0
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
OPTS = {"max_seq_length": 128, "max_predictions_per_seq": 20, "masked_lm_prob": 0.15, "dupe_factor": 1}


def timed(cmd, **kw):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        raise SystemExit(f"{cmd[:4]} failed:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t, r


def output_statistics(pattern: str, mb: float) -> dict:
    import numpy as np
    import tensorflow as tf
    spec = {"input_mask": tf.io.FixedLenFeature([OPTS["max_seq_length"]], tf.int64),
            "masked_lm_weights": tf.io.FixedLenFeature([OPTS["max_predictions_per_seq"]], tf.float32),
            "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64)}
    real, masked, nsp = [], [], []
    for batch in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern)).batch(4096):
        ex = tf.io.parse_example(batch, spec)
        real.append(ex["input_mask"].numpy().sum(1))
        masked.append(ex["masked_lm_weights"].numpy().sum(1))
        nsp.append(ex["next_sentence_labels"].numpy()[:, 0])
    real, masked, nsp = (np.concatenate(x) for x in (real, masked, nsp))
    return {"instances": len(real), "per_mb": len(real) / mb, "real": real.mean(), "masked": masked.mean(),
            "random_next": nsp.mean()}


def main():
    import corpus
    import prepare
    tmp = Path(tempfile.mkdtemp())
    text = tmp / "corpus.txt"
    corpus.generate(str(text), MB, seed=0)
    vocab = tmp / "vocab.txt"
    prepare.train_vocab([str(text)], 30000, False, str(vocab))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")

    flags = [f"--{k}={v}" for k, v in OPTS.items()]
    ref_cmd = [sys.executable, "-m", "official.nlp.data.create_pretraining_data", f"--input_file={text}",
               f"--output_file={tmp / 'ref.tfrecord'}", f"--vocab_file={vocab}", "--do_lower_case=False",
               "--random_seed=12345", *flags]
    ours_cmd = [sys.executable, str(JOB / "prepare.py"), "--input", str(text), "--output", str(tmp / "ours"),
                "--vocab", str(vocab), "--seed", "12345", *[f"--{k.replace('_', '-')}={v}" for k, v in OPTS.items()]]
    ratios, t_ours, t_ref = [], [], []
    for i in range(ROUNDS):
        shutil.rmtree(tmp / "ours", ignore_errors=True)
        t_ours.append(timed(ours_cmd, env=env)[0])
        t_ref.append(timed(ref_cmd, env=env)[0])
        ratios.append(t_ref[-1] / t_ours[-1])
        print(f"round {i + 1}: reference {t_ref[-1]:.1f} s, ours {t_ours[-1]:.1f} s: {ratios[-1]:.1f}x", flush=True)
    mb = text.stat().st_size / 1e6
    print(f"corpus: {mb:.1f} MB generated Hangul/Latin text, 30k WordPiece vocabulary, seq 128, 20 predictions")
    print(f"{ROUNDS} rounds, each ours then the reference; medians:")
    print(f"reference create_pretraining_data : {median(t_ref):7.1f} s  {mb / median(t_ref):5.2f} MB/s")
    print(f"jobs/bert_pretrain/prepare.py     : {median(t_ours):7.1f} s  {mb / median(t_ours):5.2f} MB/s")
    print(f"speed-up, median of the rounds    : {median(ratios):7.1f}x  (range {min(ratios):.1f}-{max(ratios):.1f}x; "
          f"goal >= 15x)")
    ref = output_statistics(str(tmp / "ref.tfrecord"), mb)
    ours = output_statistics(str(tmp / "ours" / "part-*.tfrecord"), mb)
    print(f"{'':22s} {'instances':>9s} {'per MB':>8s} {'real tokens':>11s} {'masked':>7s} {'random next':>11s}")
    for name, st in (("reference", ref), ("prepare.py", ours)):
        print(f"{name:22s} {st['instances']:9d} {st['per_mb']:8.1f} {st['real']:11.1f} {st['masked']:7.2f} "
              f"{st['random_next']:11.1%}")


if __name__ == "__main__":
    main()
