"""Warm restarts (host/compilecache.py): the time from a restart of the BERT job (jobs/bert_pretrain, Keras 3 on JAX,
on this CPU) to its first step, with the compilation cache the agent gives a job against a cold start.

Each start is the job's own process, started with the environment the agent would add (compilecache.environment)
and timed from its start to its first step's log line:
- no cache: what every restart paid before (baseline);
- cold: an empty cache, written as it compiles (a job's first start);
- warm: the same host's cache (a restart after a preemption notice, a crash, a drill);
- made again: the host's cache gone, restored from the store's copy that worker 0 shipped (a host made again).
Goal: warm <= 0.3x no cache.

    python bench/bench_compile_cache.py [PRESET] [SEQ]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))
sys.path.insert(0, str(ROOT))
PRESET = sys.argv[1] if len(sys.argv) > 1 else "tiny"
SEQ = sys.argv[2] if len(sys.argv) > 2 else "128"


def first_step(args, env, out: Path) -> tuple[float, float]:
    """(seconds from the process's start to its first step line, to its end)."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, str(JOB / "train.py"), *args, "--output", str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    assert p.stdout is not None
    for line in p.stdout:
        if first is None and line.startswith("step "):
            first = time.perf_counter() - t0
    rc = p.wait()
    if rc != 0 or first is None:
        raise SystemExit(f"train.py exited {rc} without a step")
    return first, time.perf_counter() - t0


def main():
    import corpus
    import prepare
    from tpuctl.core.runs import RunSpec
    from tpuctl.core.store import LocalStore
    from tpuctl.host import compilecache
    tmp = Path(tempfile.mkdtemp(prefix="bench-cc-"))
    corpus.generate(str(tmp / "c.txt"), 1, seed=0)
    s = prepare.main(["--input", str(tmp / "c.txt"), "--output", str(tmp / "prep"), "--vocab-size", "2000",
                      "--max-seq-length", SEQ, "--workers", "1"])
    args = ["--data", f"{tmp}/prep/part-*.tfrecord", "--vocab-size", str(s["vocab_size"]), "--preset", PRESET,
            "--seq-length", SEQ, "--steps", "2", "--log-every", "1", "--checkpoint-every", "1000"]
    base = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
                PYTHONPATH=str(ROOT))
    home, store = tmp / "home", LocalStore(str(tmp / "store"))
    job = RunSpec(id="r", name="bert", command="python train.py", package="bench")
    rows = []
    none, _ = first_step(args, base, tmp / "o")
    rows.append(("no cache", none))
    cc = compilecache.environment(home, store, job, None)
    cold, _ = first_step(args, {**base, **cc}, tmp / "o")
    rows.append(("cold (empty cache)", cold))
    warm, _ = first_step(args, {**base, **cc}, tmp / "o")
    rows.append(("warm (this host's cache)", warm))
    compilecache.ship(store, home, cc, 0)
    d = Path(cc[compilecache.DIR_ENV])
    entries = len(compilecache._entries(d)) - 1   # less the .shipped list
    size = sum(compilecache._entries(d).values())
    shutil.rmtree(home)
    cc = compilecache.environment(home, store, job, None)   # a host made again: restored from the store
    again, _ = first_step(args, {**base, **cc}, tmp / "o")
    rows.append(("made again (from the store)", again))
    print(f"BERT {PRESET}, seq {SEQ}, Keras 3 on JAX, CPU: time to the first step ({entries} cache entries, "
          f"{size / 1e6:.1f} MB)")
    for what, t in rows:
        print(f"  {what:28s} {t:6.1f} s  {t / none:5.2f}x")
    print(f"warm / no cache: {warm / none:.2f}x (goal <= 0.3x)")
    print(json.dumps({"preset": PRESET, "seq": int(SEQ), **{w: round(t, 2) for w, t in rows}}))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
