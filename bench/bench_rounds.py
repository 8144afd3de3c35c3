"""Whole-run restarts (tpuctl/host/rounds.py): how long from one host's job exiting 42 to the job running again on
every host of a 2 slices x 2 hosts cluster (four real agent processes on one local store, as four TPU VMs share a
bucket), against the baseline of the same restart on a single host (the job started again in its own agent's loop),
measured here in the same run. Each job records its start times in the run's output.

    python bench/bench_rounds.py [RESTARTS]
    python bench/bench_rounds.py lost [BACK_AFTER_SECONDS]

`lost` (issue 39 item 2): the time from a host's loss to every host training again. One host of the four is powered
off (its agent and its job SIGKILLed at once) and boots again BACK_AFTER_SECONDS (5) later; meanwhile the other
three jobs end as JAX's do once a peer is gone: a second later, exit 1 (an exception) in one case, 134 (an abort,
with --max-restarts 1) in the other. The waits are the defaults (TPUCTL_STALE_SECONDS 90; the peer-lost wait of
host/rounds.py, where there is one). To measure another checkout's code, run it from outside this checkout with
PYTHONPATH=that/checkout (the agents start with `python -m`, which puts the working directory first):
    cd /tmp && PYTHONPATH=/work/main python /path/to/bench/bench_rounds.py lost
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

LOST = len(sys.argv) > 1 and sys.argv[1] == "lost"
RESTARTS = int(sys.argv[1]) if len(sys.argv) > 1 and not LOST else 5
BACK_AFTER = float(sys.argv[2]) if LOST and len(sys.argv) > 2 else 5.0
LOST_JOB = """
import os, sys, time
w, out = os.environ["TPUCTL_WORKER"], os.environ["TPUCTL_OUTPUT_DIR"]
p = os.path.join(out, f"starts-w{w}")
n = len(open(p).read().splitlines()) if os.path.exists(p) else 0
open(p, "a").write(f"{time.time()}\\n")
while not os.path.exists(os.environ["GO"]):
    if n == 0 and w != "3" and os.path.exists(os.environ["DEAD"]):
        time.sleep(1)
        os.abort() if os.environ["EXIT"] == "134" else sys.exit(int(os.environ["EXIT"]))
    time.sleep(0.1)
"""
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


def lost(code: str, root: Path) -> str:
    """Seconds from host s1/w1's power-off to all four hosts' next start, or what became of the run instead."""
    import uuid
    sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
    from fakes.tpu_host import kill_agent_home
    from jobs import make_job
    from tpuctl.core import layout, packaging, runindex, runs
    from tpuctl.core.store import LocalStore
    store_dir = root / f"lost-{code}"
    store = LocalStore(store_dir)
    store.write(layout.CLUSTER_RECORD, json.dumps({"name": "b", "hosts": 2, "slices": 2, "coordinator": "127.0.0.1",
                                                   "framework": "jax"}).encode())
    agents = {}

    def boot(k, w):
        env = dict(os.environ, TPUCTL_HOST=f"h-s{k}w{w}", TPUCTL_AGENT_HOME=str(root / f"{code}-s{k}w{w}"),
                   TPUCTL_BOOT_ID=uuid.uuid4().hex)
        agents[k, w] = subprocess.Popen([sys.executable, "-m", "tpuctl.agent", "--store", str(store_dir), "--slice",
                                         str(k), "--worker", str(w), "--poll", "0.25"], env=env,
                                        stdout=open(root / f"agent-{code}-s{k}w{w}.log", "ab"), stderr=subprocess.STDOUT)
    for k, w in ((0, 0), (0, 1), (1, 0), (1, 1)):
        boot(k, w)
    pkg, sha = packaging.build(make_job(root, LOST_JOB, name=f"job-{code}"))
    store.create(layout.job_package(sha), pkg)
    run_id = runs.new_id()
    spec = runs.RunSpec(id=run_id, name="b", command="python main.py", package=sha, framework="jax",
                        max_restarts=1 if code == "134" else 0,
                        env={"GO": str(root / f"go-{code}"), "DEAD": str(root / f"dead-{code}"), "EXIT": code})
    store.create(layout.run_job(run_id), json.dumps(spec.to_json()).encode())
    runindex.register(store, run_id)
    out = store_dir / "runs" / run_id / "output"

    def starts(w):
        p = out / f"starts-w{w}"
        return [float(t) for t in p.read_text().split()] if p.exists() else []
    try:
        while not all(starts(w) for w in range(4)):
            time.sleep(0.2)
        lost_at = time.time()
        agents[1, 1].kill()
        kill_agent_home(root / f"{code}-s1w1")   # its jobs too: they run in sessions of their own
        (root / f"dead-{code}").write_text("")
        time.sleep(BACK_AFTER)
        boot(1, 1)
        deadline = time.time() + 300
        while time.time() < deadline:
            if all(len(starts(w)) >= 2 for w in range(4)):
                st = runs.status(store, run_id, 0)
                return f"{max(starts(w)[1] for w in range(4)) - lost_at:6.1f} s (restarts counted: {st.restarts})"
            final = [runs.status(store, run_id, w) for w in range(3)]
            if any(s.state.final for s in final):
                return f"never: the run ended {final[0].state.value} ({final[0].note[:70]})"
            time.sleep(0.2)
        return "never (300 s)"
    finally:
        (root / f"go-{code}").write_text("")
        for p in agents.values():
            p.send_signal(signal.SIGTERM)
        for p in agents.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def main():
    root = Path(tempfile.mkdtemp())
    os.environ.update(TPUCTL_HOME=str(root / "home"), TPUCTL_CONFIG="/nonexistent", TPUCTL_STALE_SECONDS="30")
    if LOST:
        print(f"a host lost, back after {BACK_AFTER:g} s; the others' jobs end a second after the loss:")
        for code, how in (("1", "exit 1, --max-restarts 0"), ("134", "abort (134), --max-restarts 1")):
            print(f"  {how:30s}: every host training again after {lost(code, root)}", flush=True)
        return
    one = measure("one", 1, root)
    four = measure("four", 4, root)
    med = sorted(one)[len(one) // 2], sorted(four)[len(four) // 2]
    print(f"restart after exit 42, {RESTARTS} times (median, max):")
    print(f"  one host (baseline)       : {med[0]:5.2f} s  {max(one):5.2f} s")
    print(f"  2 slices x 2 hosts, rounds: {med[1]:5.2f} s  {max(four):5.2f} s   {med[1] - med[0]:+.2f} s, "
          f"{med[1] / med[0]:.1f}x the baseline")


if __name__ == "__main__":
    main()
