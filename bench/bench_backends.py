"""The BERT job's training speed on each Keras backend on this CPU, in one run: steps/s of the tiny and mini presets
on TensorFlow and on JAX (train.py itself, each backend in its own process: Keras fixes the backend at import), on
the same prepared data, alternating backends so the machine's noise falls on both alike. The rate is the last
log interval's (compiled and warm), so first-step compilation is left out; the import and start-up time of each
process is printed beside it.

    python bench/bench_backends.py [STEPS] [BATCH]      # default 40 steps of batch 32, seq 128
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = Path(__file__).resolve().parent.parent / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
BATCH = int(sys.argv[2]) if len(sys.argv) > 2 else 32
BACKENDS, PRESETS = ("tensorflow", "jax"), ("tiny", "mini")


def run(backend: str, preset: str, pattern: str, vocab: int, out: Path) -> dict:
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    t = time.perf_counter()
    r = subprocess.run([sys.executable, str(JOB / "train.py"), "--data", pattern, "--vocab-size", str(vocab),
                        "--preset", preset, "--steps", str(STEPS), "--batch-size", str(BATCH),
                        "--log-every", str(STEPS // 2), "--checkpoint-every", "100000", "--output", str(out)],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    lines = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("step ")]
    rate = float(lines[-1][-1])   # examples/s of the last interval
    return {"steps_per_s": rate / BATCH, "seconds": time.perf_counter() - t, "loss": float(lines[-1][3])}


def main():
    import corpus
    import prepare
    tmp = Path(tempfile.mkdtemp())
    corpus.generate(str(tmp / "c.txt"), 1, seed=0)
    s = prepare.main(["--input", str(tmp / "c.txt"), "--output", str(tmp / "prep"), "--vocab-size", "8000"])
    pattern = f"{tmp / 'prep'}/part-*.tfrecord"
    results = {}
    for preset in PRESETS:
        for i, backend in enumerate(BACKENDS if PRESETS.index(preset) % 2 == 0 else BACKENDS[::-1]):
            results[(backend, preset)] = run(backend, preset, pattern, s["vocab_size"], tmp / f"{backend}-{preset}")
    print(f"\ntrain.py on this CPU ({os.cpu_count()} cores), batch {BATCH}, seq 128, {STEPS} steps; steps/s over "
          f"the last {STEPS // 2} steps")
    print(f"{'preset':8s} {'backend':11s} {'steps/s':>8s} {'process s':>10s} {'loss':>8s}")
    for (backend, preset), r in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"{preset:8s} {backend:11s} {r['steps_per_s']:8.2f} {r['seconds']:10.1f} {r['loss']:8.4f}")
    for preset in PRESETS:
        ratio = results[("jax", preset)]["steps_per_s"] / results[("tensorflow", preset)]["steps_per_s"]
        print(f"{preset}: JAX / TensorFlow = {ratio:.2f}x")
    print(json.dumps({f"{b}/{p}": round(r["steps_per_s"], 3) for (b, p), r in results.items()}))


if __name__ == "__main__":
    main()
