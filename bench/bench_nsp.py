"""Can next-sentence prediction be learned from the generated corpus? The tiny preset trained for STEPS on the
topical corpus (corpus.py: a topic per document) and, as the baseline in the same script, on the same generator with
topics off (every word drawn independently, as before issue 13); both evaluated on held-out documents of their own
kind. Prints the held-out NSP accuracy of each against its base rate (the share of the majority label).

    python bench/bench_nsp.py [STEPS]      # default 300
"""
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
JOB = Path(__file__).resolve().parent.parent / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 300


def base_rate(pattern: str) -> float:
    import numpy as np
    import tensorflow as tf
    spec = {"next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64)}
    labels = [int(tf.io.parse_single_example(r, spec)["next_sentence_labels"][0])
              for r in tf.data.TFRecordDataset(tf.io.gfile.glob(pattern))]
    return float(max(np.mean(labels), 1 - np.mean(labels)))


def run(tmp: Path, topical: float) -> tuple[float, float]:
    import corpus
    import prepare
    import train
    kind = tmp / f"topical-{topical}"
    kind.mkdir()
    corpus.generate(str(kind / "train.txt"), 2, seed=0, topical=topical)
    corpus.generate(str(kind / "held.txt"), 0.3, seed=0, draw=1, topical=topical)
    s = prepare.main(["--input", str(kind / "train.txt"), "--output", str(kind / "train"), "--vocab-size", "8000"])
    prepare.main(["--input", str(kind / "held.txt"), "--output", str(kind / "held"),
                  "--vocab", str(kind / "train" / "vocab.txt")])
    held = f"{kind / 'held'}/part-*.tfrecord"
    result = train.main(["--data", f"{kind / 'train'}/part-*.tfrecord", "--vocab-size", str(s["vocab_size"]),
                         "--preset", "tiny", "--steps", str(STEPS), "--log-every", str(max(1, STEPS // 6)),
                         "--checkpoint-every", "100000", "--output", str(kind / "out"), "--eval-data", held,
                         "--eval-steps", "30"])
    return result["eval"]["nsp_acc"], base_rate(held)


def main():
    tmp = Path(tempfile.mkdtemp())
    topical, topical_base = run(tmp, 0.8)
    flat, flat_base = run(tmp, 0.0)
    print(f"held-out NSP accuracy after {STEPS} steps (tiny, batch 32, seq 128):")
    print(f"  topical corpus      {topical:.3f}  (base rate {topical_base:.3f}, +{topical - topical_base:.3f})")
    print(f"  independent words   {flat:.3f}  (base rate {flat_base:.3f}, +{flat - flat_base:.3f})")


if __name__ == "__main__":
    main()
