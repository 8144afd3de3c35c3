"""Print-to-terminal latency on the local provider: a job prints its clock every 0.2 s; the CLI's follower notes
when each line arrives (goal: every line within 2 s). Baseline in the same run: the same job read straight from a
pipe, which is the floor any log shipping adds to.

    python bench/bench_latency.py
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = "import time\nfor i in range(25):\n    print(time.time(), flush=True)\n    time.sleep(0.2)\n"


def latencies(lines_with_arrival):
    return [arrival - float(line) for line, arrival in lines_with_arrival if line.strip()]


def main():
    home = tempfile.mkdtemp()
    os.environ.update(TPUCTL_HOME=home, TPUCTL_CONFIG="/nonexistent")
    job = Path(home) / "job"
    job.mkdir()
    (job / "tpuctl.toml").write_text('command = "python main.py"\n')
    (job / "main.py").write_text(JOB)

    # baseline: straight from a pipe
    got = []
    p = subprocess.Popen([sys.executable, "-u", str(job / "main.py")], stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        got.append((line, time.time()))
    base = latencies(got)

    tpuctl = [sys.executable, "-m", "tpuctl"]
    subprocess.run(tpuctl + ["up", "--provider", "local", "-c", "lat"], check=True, capture_output=True)
    try:
        run_id = subprocess.run(tpuctl + ["submit", str(job), "-c", "lat", "--detach"], check=True,
                                capture_output=True, text=True).stdout.strip()
        got = []
        f = subprocess.Popen(tpuctl + ["logs", run_id, "-c", "lat", "-f"], stdout=subprocess.PIPE, text=True)
        for line in f.stdout:
            got.append((line, time.time()))
        lat = latencies(got)
    finally:
        subprocess.run(tpuctl + ["down", "-c", "lat", "--yes", "--delete-bucket"], capture_output=True)
    print(f"lines: {len(lat)}")
    print(f"pipe baseline      : median {statistics.median(base) * 1000:6.0f} ms, max {max(base) * 1000:6.0f} ms")
    print(f"tpuctl logs -f     : median {statistics.median(lat) * 1000:6.0f} ms, max {max(lat) * 1000:6.0f} ms "
          f"(goal: max <= 2000 ms; {max(lat) / 2.0:.2f} of the goal)")


if __name__ == "__main__":
    main()
