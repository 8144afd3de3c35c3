"""BERT data preparation at scale: wall time and peak memory of jobs/bert_pretrain/prepare.py (2 workers,
--chunk-mb 2) on generated corpora of 20 MB and 200 MB (issue 13: memory must stay flat as the input grows; the
reference holds every instance in memory, 30-60 GB for a 1 GB corpus by its users' reports).

    python bench/bench_prepare_memory.py [MB ...]      # default 20 200

Peak memory is the largest resident set of any one process (the parent or a worker), from getrusage.
"""
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = Path(__file__).resolve().parent.parent / "jobs" / "bert_pretrain"
sys.path.insert(0, str(JOB))
SIZES = [float(x) for x in sys.argv[1:]] or [20.0, 200.0]


def main():
    import corpus
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for mb in SIZES:
        text = tmp / f"c{mb:g}.txt"
        corpus.generate(str(text), mb, seed=0)
        cmd = [sys.executable, str(JOB / "prepare.py"), "--input", str(text), "--output", str(tmp / f"p{mb:g}"),
               "--vocab-size", "30000", "--workers", "2", "--chunk-mb", "2"]
        t = time.perf_counter()
        # each size in its own child, so getrusage's high-water mark is that run's alone
        probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        peak_kb = int(subprocess.run([sys.executable, "-c", probe, *cmd], check=True, capture_output=True,
                                     text=True).stdout.split()[-1])
        secs = time.perf_counter() - t
        rows.append((mb, secs, peak_kb / 1024))
        print(f"{mb:6.0f} MB: {secs:6.1f} s ({mb / secs:4.1f} MB/s), peak {peak_kb / 1024:6.0f} MB", flush=True)
    if len(rows) > 1:
        (a, _, ma), (b, _, mb_) = rows[0], rows[-1]
        print(f"input x{b / a:.0f}: peak memory x{mb_ / ma:.2f}")


if __name__ == "__main__":
    main()
