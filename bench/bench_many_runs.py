"""What a long history costs the next command, on the local provider: two clusters, one empty and one holding
20,000 finished runs planted in its store as submit and the agent write them (job.json, claim, status, a log chunk,
metrics.json, the index entry), then, in interleaved rounds, `submit` of a one-line job to its first output line,
`jobs`, `logs` and `status` on each. Prints the ratio with history to without (goal <= 1.5x each, `jobs` under 1 s),
and the one-time indexing of a store written before the index existed.

    python bench/bench_many_runs.py [--runs 20000] [--rounds 15]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TPUCTL = [sys.executable, "-m", "tpuctl"]


def plant(store_root: str, n: int) -> float:
    from tpuctl.core import layout, runindex
    from tpuctl.core.runs import RunSpec, RunState, RunStatus
    from tpuctl.core.store import LocalStore
    store = LocalStore(store_root)
    t0 = time.perf_counter()
    base = time.time() - 365 * 86400    # a year of sweeps, a run every half hour or so
    for i in range(n):
        started = base + i * 1500
        run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started)) + f"-{i % 1000:03d}-{i % 65536:04x}"
        spec = RunSpec(id=run_id, name=f"sweep-{i}", command="python main.py", package="0" * 64,
                       submitted=started, cluster="hist")
        store.write(layout.run_job(run_id), json.dumps(spec.to_json()).encode())
        store.write(layout.run_claim(run_id, 0), json.dumps({"host": "h", "worker": 0, "time": started,
                                                             "attempt": 1}).encode())
        store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(
            state=RunState.SUCCEEDED, exit_code=0, started=started, ended=started + 600, heartbeat=started + 600,
            host="h").to_json()).encode())
        store.write(layout.log_chunk(run_id, 0, 1), f"sweep {i} done\n".encode())
        store.write(layout.run_metrics(run_id), json.dumps({"step": 100, "metrics": {"loss": 1.0 / (i + 1)},
                                                            "history": {"loss": [[100, 1.0 / (i + 1)]]}}).encode())
        store.create(layout.run_index(runindex.flip(run_id)), run_id.encode())
    store.write(layout.RUN_INDEX_COMPLETE, str(n).encode())
    return time.perf_counter() - t0


def timed(args: list[str], first_line: bool = False) -> float:
    """Seconds the command took; with first_line, until its first line on stdout (then it runs to its end)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(TPUCTL + args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    took = None
    for _ in p.stdout:
        if first_line and took is None:
            took = time.perf_counter() - t0
    if p.wait() != 0:
        raise SystemExit(f"tpuctl {' '.join(args)} failed")
    return took if took is not None else time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    home = tempfile.mkdtemp()
    os.environ.update(TPUCTL_HOME=home, TPUCTL_CONFIG="/nonexistent", TPUCTL_LOG_POLL_MAX="0.2")
    job = Path(home) / "job"
    job.mkdir()
    (job / "tpuctl.toml").write_text('command = "python main.py"\n')
    (job / "main.py").write_text("print('hello', flush=True)\n")
    stores = {}
    for name in ("empty", "hist"):
        subprocess.run(TPUCTL + ["up", "--provider", "local", "-c", name], check=True, capture_output=True)
        stores[name] = json.loads(subprocess.run(TPUCTL + ["status", "-c", name, "--json"], check=True,
                                                 capture_output=True, text=True).stdout)["store"]
    try:
        took = plant(stores["hist"], a.runs)
        print(f"planted {a.runs} finished runs in {took:.1f} s")
        # `jobs` shows up to 20 rows with history and only the few runs this bench submitted without: its rendering
        # differs by rows shown; `jobs --limit 1` shows one row on both, so its ratio is history's cost alone.
        commands = {"submit (to its first line)": (["submit", str(job)], True), "jobs": (["jobs"], False),
                    "jobs --limit 1": (["jobs", "--limit", "1"], False),
                    "logs (latest run)": (["logs"], False), "status": (["status"], False)}
        times = {(c, n): [] for c in commands for n in stores}
        for _ in range(a.rounds):
            for label, (args, first) in commands.items():
                for name in stores:
                    times[(label, name)].append(timed(args + ["-c", name], first))
        # the mean, not the median: a submit's time is bimodal on both clusters (where the agent's 0.25 s poll and
        # the follower's backoff fall), and a median of few samples jumps between the modes
        print(f"{'command':28} {'empty':>9} {f'{a.runs} runs':>11} {'ratio':>7}   (mean of {a.rounds})")
        for label in commands:
            e, h = (statistics.mean(times[(label, n)]) for n in stores)
            print(f"{label:28} {e * 1000:7.0f}ms {h * 1000:9.0f}ms {h / e:6.2f}x   "
                  f"(ms: {[round(x * 1000) for x in times[(label, 'empty')]]} vs "
                  f"{[round(x * 1000) for x in times[(label, 'hist')]]})")
        jobs = statistics.mean(times[("jobs", "hist")])
        print(f"jobs with history: {jobs:.2f} s (goal: under 1 s); goal for each ratio: <= 1.5x")
        # A store written before the index: the first command indexes it, once.
        from tpuctl.core import layout
        from tpuctl.core.store import LocalStore
        store = LocalStore(stores["hist"])
        for key, _ in store.list("tpuctl/index/"):
            store.delete(key)
        once = timed(["jobs", "-c", "hist"])
        again = timed(["jobs", "-c", "hist"])
        print(f"a store from before the index: first `jobs` {once:.1f} s (indexes {a.runs} runs, once), "
              f"next {again:.2f} s; marker {store.read(layout.RUN_INDEX_COMPLETE)!r}")
    finally:
        for name in stores:
            subprocess.run(TPUCTL + ["down", "-c", name, "--yes", "--delete-bucket"], capture_output=True)


if __name__ == "__main__":
    main()
