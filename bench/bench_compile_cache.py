"""Warm restarts (host/compilecache.py): the time from a restart of the BERT job (jobs/bert_pretrain, Keras 3 on JAX,
on this CPU) to its first step, with the compilation cache the agent gives a job against a cold start.

Each start is the job's own process, started with the environment the agent would add (compilecache.environment)
and timed from its start to its first step's log line:
- no cache: what every restart paid before (baseline);
- cold: an empty cache, written as it compiles (a job's first start);
- warm: the same host's cache (a restart after a preemption notice, a crash, a drill);
- made again: the host's cache gone, restored from the store's copy that worker 0 shipped (a host made again).
Goal: warm <= 0.3x no cache.

Each start also reports one step's own execution (its second step's line less its first's): on this CPU a BERT-base
step at batch 32 runs for tens of seconds, which no cache can save, while on a TPU it is a fraction of a second; the
time to the first step less that execution is what a cache can reach. BATCH (per replica, default 32: the job's)
lets the step's execution shrink to what a TPU's would be beside its compile.

    python bench/bench_compile_cache.py [PRESET] [SEQ] [BATCH]
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
BATCH = sys.argv[3] if len(sys.argv) > 3 else "32"


def first_step(args, env, out: Path) -> tuple[float, float]:
    """(seconds from the process's start to its first step line, one step's execution: its second step line less
    its first)."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, str(JOB / "train.py"), *args, "--output", str(out)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    steps: list[float] = []
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("step "):
            steps.append(time.perf_counter() - t0)
    rc = p.wait()
    if rc != 0 or len(steps) < 2:
        raise SystemExit(f"train.py exited {rc} with {len(steps)} step line(s), not 2")
    return steps[0], steps[1] - steps[0]


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
            "--seq-length", SEQ, "--batch-size", BATCH, "--steps", "2", "--log-every", "1", "--checkpoint-every", "1000"]
    base = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
                PYTHONPATH=str(ROOT))
    home, store = tmp / "home", LocalStore(str(tmp / "store"))
    job = RunSpec(id="r", name="bert", command="python train.py", package="bench")
    rows = []
    none, step = first_step(args, base, tmp / "o")
    rows.append(("no cache", none, step))
    cc = compilecache.environment(home, store, job, None)
    cold, step = first_step(args, {**base, **cc}, tmp / "o")
    rows.append(("cold (empty cache)", cold, step))
    warm, step = first_step(args, {**base, **cc}, tmp / "o")
    rows.append(("warm (this host's cache)", warm, step))
    compilecache.ship(store, home, cc, 0)
    d = Path(cc[compilecache.DIR_ENV])
    entries = len(compilecache._entries(d)) - 1   # less the .shipped list
    size = sum(compilecache._entries(d).values())
    shutil.rmtree(home)
    cc = compilecache.environment(home, store, job, None)   # a host made again: restored from the store
    again, step = first_step(args, {**base, **cc}, tmp / "o")
    rows.append(("made again (from the store)", again, step))
    print(f"BERT {PRESET}, seq {SEQ}, batch {BATCH}, Keras 3 on JAX, CPU: time to the first step ({entries} cache "
          f"entries, {size / 1e6:.1f} MB); a step's own execution; the first step less it")
    less = {what: t - s for what, t, s in rows}
    for what, t, s in rows:
        print(f"  {what:28s} {t:6.1f} s  {t / none:5.2f}x   step {s:5.1f} s   less it {less[what]:6.1f} s  "
              f"{less[what] / less['no cache']:5.2f}x")
    warm_less = less["warm (this host's cache)"] / less["no cache"]
    print(f"warm / no cache: {warm / none:.2f}x, less a step's execution {warm_less:.2f}x (goal <= 0.3x)")
    print(json.dumps({"preset": PRESET, "seq": int(SEQ), "batch": int(BATCH),
                      **{w: [round(t, 2), round(s, 2)] for w, t, s in rows}}))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
