"""Tiny-preset BERT training throughput on this CPU (examples/s of model.fit, steady state) against the input
pipeline alone (tf.data over the same TFRecords): the pipeline must outrun the model at least 5x.

    python bench/bench_train.py [STEPS]
"""
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
JOB = Path(__file__).resolve().parent.parent / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 60


def main():
    import corpus
    import prepare
    tmp = Path(tempfile.mkdtemp())
    corpus.generate(str(tmp / "c.txt"), 4, seed=0)
    s = prepare.main(["--input", str(tmp / "c.txt"), "--output", str(tmp / "prep"), "--vocab-size", "30000"])
    import train
    from data import dataset
    pattern = f"{tmp / 'prep'}/part-*.tfrecord"
    ds = dataset(pattern, 32, 128, 20)
    it = iter(ds)
    for _ in range(20):
        next(it)
    t = time.perf_counter()
    n = 500
    for _ in range(n):
        next(it)
    pipe = n * 32 / (time.perf_counter() - t)
    result = train.main(["--data", pattern, "--vocab-size", str(s["vocab_size"]), "--preset", "tiny",
                         "--steps", str(STEPS), "--log-every", str(STEPS // 3), "--checkpoint-every", "100000",
                         "--output", str(tmp / "out")])
    model = result["examples_per_s"]   # the last interval: compiled and warm
    print(f"input pipeline alone : {pipe:9.0f} examples/s")
    print(f"tiny BERT model.fit  : {model:9.1f} examples/s (steady state, float32, seq 128, batch 32)")
    print(f"pipeline / model     : {pipe / model:9.1f}x  (goal >= 5x)")


if __name__ == "__main__":
    main()
