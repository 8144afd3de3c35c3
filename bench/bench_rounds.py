"""Whole-run restarts (tpuctl/host/rounds.py): how long from one host's job exiting 42 to the job running again on
every host of a 2 slices x 2 hosts cluster (four real agent processes on one local store, as four TPU VMs share a
bucket), against the baseline of the same restart on a single host (the job started again in its own agent's loop),
measured here in the same run. Each job records its start times in the run's output.

    python bench/bench_rounds.py [RESTARTS]
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

RESTARTS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
JOB = """
import os, sys, time
w, out = os.environ["TPUCTL_WORKER"], os.environ["TPUCTL_OUTPUT_DIR"]
p = os.path.join(out, f"starts-w{w}")
n = len(open(p).read().splitlines()) if os.path.exists(p) else 0
open(p, "a").write(f"{time.time()}\\n")
time.sleep(1.0)
exits = int(os.environ["RESTARTS"])
if w == os.environ["EXITING"] and n < exits:
    open(os.path.join(out, f"exits-w{w}"), "a").write(f"{time.time()}\\n")
    sys.exit(42)
sys.exit(0)
"""


def tpuctl(*args):
    r = subprocess.run([sys.executable, "-m", "tpuctl", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode:
        raise SystemExit(f"tpuctl {' '.join(args)} exited {r.returncode}: {r.stderr[-500:]}")
    return r.stdout.strip()


def measure(name: str, hosts: int, root: Path) -> list[float]:
    """Seconds from each exit 42 to the last host's next start."""
    tpuctl("up", "--provider", "local", "-c", name)
    store = Path(json.loads(tpuctl("status", "-c", name, "--json"))["store"])
    agents = []
    if hosts > 1:
        record = json.loads((store / "tpuctl/cluster.json").read_text())
        record.update(hosts=2, slices=2, coordinator="127.0.0.1", framework="jax")
        (store / "tpuctl/cluster.json").write_text(json.dumps(record))
        for k, w in ((0, 1), (1, 0), (1, 1)):
            env = dict(os.environ, TPUCTL_HOST=f"{name}-s{k}w{w}", TPUCTL_AGENT_HOME=str(root / f"{name}-s{k}w{w}"))
            agents.append(subprocess.Popen([sys.executable, "-m", "tpuctl.agent", "--store", str(store), "--slice",
                                            str(k), "--worker", str(w), "--poll", "0.25"], env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    job = root / f"job-{name}"
    job.mkdir()
    framework = 'framework = "jax"\n' if hosts > 1 else ""
    (job / "tpuctl.toml").write_text(f'command = "python main.py"\n{framework}[env]\nRESTARTS = "{RESTARTS}"\n'
                                     f'EXITING = "{hosts - 1}"\n')
    (job / "main.py").write_text(textwrap.dedent(JOB))
    try:
        run_id = tpuctl("submit", str(job), "-c", name, "--detach", "--max-restarts", str(RESTARTS))
        deadline = time.time() + 60 + 10 * RESTARTS
        while time.time() < deadline:
            rows = json.loads(tpuctl("jobs", "-c", name, "--json"))
            if rows and rows[0]["state"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        out = store / "runs" / run_id / "output"
        exits = [float(t) for t in (out / f"exits-w{hosts - 1}").read_text().split()]
        starts = [[float(t) for t in (out / f"starts-w{w}").read_text().split()] for w in range(hosts)]
        return [max(s[i + 1] for s in starts) - exits[i] for i in range(len(exits))]
    finally:
        for p in agents:
            p.send_signal(signal.SIGTERM)
        for p in agents:
            p.wait(30)
        tpuctl("down", "-c", name, "--yes")


def main():
    root = Path(tempfile.mkdtemp())
    os.environ.update(TPUCTL_HOME=str(root / "home"), TPUCTL_CONFIG="/nonexistent", TPUCTL_STALE_SECONDS="30")
    one = measure("one", 1, root)
    four = measure("four", 4, root)
    med = sorted(one)[len(one) // 2], sorted(four)[len(four) // 2]
    print(f"restart after exit 42, {RESTARTS} times (median, max):")
    print(f"  one host (baseline)       : {med[0]:5.2f} s  {max(one):5.2f} s")
    print(f"  2 slices x 2 hosts, rounds: {med[1]:5.2f} s  {max(four):5.2f} s   {med[1] - med[0]:+.2f} s, "
          f"{med[1] / med[0]:.1f}x the baseline")


if __name__ == "__main__":
    main()
