"""`tpuctl drill`'s own cost: the drill's wall time against the job's own, with the drills' grace.

The job is tests/test_drill.py's fixture (a pure-Python loop: a 3-s "compile", 0.05-s steps, a 1.2-s checkpoint
every 10 steps, saving on SIGTERM in every phase), so what is measured is tpuctl's part, not a framework's. Two
timings, each on its own temporary local cluster made and removed the same way:
- the job alone: `up`, `submit` (detached), its run to its end, `down`;
- the drill: `tpuctl drill --at step,save,step:kill --grace G` (one restart per drill).
The drill's time is the job's, plus what each drill makes the job do again: the time from the signal to the job's
end (bounded by the grace), the restart to its first step, and the steps redone. Goal: the drill's wall time
<= 1.1x (the job's alone + the drills' signal-to-end and restart time).

    python bench/bench_drill.py [STEPS] [GRACE]
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
STEPS = sys.argv[1] if len(sys.argv) > 1 else "200"
GRACE = sys.argv[2] if len(sys.argv) > 2 else "5"


def tpuctl(env, *args, timeout=900):
    r = subprocess.run([sys.executable, "-m", "tpuctl", *args], env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=timeout)
    if r.returncode not in (0, 1):
        raise SystemExit(f"tpuctl {' '.join(args)} exited {r.returncode}: {r.stderr[-2000:]}")
    return r


def main():
    from test_drill import FIXTURE
    from jobs import make_job
    tmp = Path(tempfile.mkdtemp(prefix="bench-drill-"))
    toml = f'[env]\nMODE = "every"\nSTEPS = "{STEPS}"\n'
    job = make_job(tmp, FIXTURE, toml, name="job-every")
    env = dict(os.environ, TPUCTL_HOME=str(tmp / "home"), TPUCTL_CONFIG=str(tmp / "config.toml"),
               TPUCTL_PROGRESS_SECONDS="0.2", TPUCTL_RESTART_BACKOFF="0")
    env.pop("TPUCTL_CLUSTER", None)
    # the job alone, on a local cluster made and removed as the drill makes and removes its own
    t0 = time.perf_counter()
    tpuctl(env, "up", "--provider", "local", "-c", "alone", "--yes")
    run_id = tpuctl(env, "submit", str(job), "-c", "alone", "--detach").stdout.strip().splitlines()[-1]
    from tpuctl.core import runs, state
    from tpuctl.core.store import LocalStore
    os.environ.update(TPUCTL_HOME=env["TPUCTL_HOME"], TPUCTL_CONFIG=env["TPUCTL_CONFIG"])
    store = LocalStore(state.load("alone").spec.store)
    while not runs.status(store, run_id).state.final:
        time.sleep(0.2)
    tpuctl(env, "down", "-c", "alone", "--provider", "local", "--delete-bucket", "--yes")
    alone = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = tpuctl(env, "drill", str(job), "--json", "--at", "step,save,step:kill", "--grace", GRACE)
    drill = time.perf_counter() - t0
    report = json.loads(r.stdout)
    extra = sum(d.get("goodput_cost_s") or 0 for d in report)   # signal to the next first step, + steps redone
    print(f"fixture job, {STEPS} steps, drills step,save,step:kill at --grace {GRACE}")
    print(f"  the job alone (up, run, down):       {alone:6.1f} s")
    print(f"  the drill (up, 3 drills, run, down): {drill:6.1f} s  (passed: {[d['passed'] for d in report]})")
    print(f"  what the drills made the job do again (signal to the next first step, steps redone): {extra:.1f} s")
    print(f"  drill / (alone + that): {drill / (alone + extra):.2f}x (goal <= 1.1x)")
    print(json.dumps({"alone_s": round(alone, 1), "drill_s": round(drill, 1), "again_s": round(extra, 1),
                      "ratio": round(drill / (alone + extra), 3), "report": report}))


if __name__ == "__main__":
    main()
