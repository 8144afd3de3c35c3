"""What a long history costs a scrape of `/metrics`, on the local provider: `tpuctl ui --metrics-only` over a cluster
holding 20,000 finished runs against one over a cluster holding 20 (planted as submit and the agent write them:
bench_many_runs.plant), each in its own tpuctl home and process, scraped in interleaved rounds as Prometheus
scrapes (Bearer token, OpenMetrics). TPUCTL_METRICS_KEEP=20, so both export 20 runs and the ratio is the history's
cost alone; the first scrape (which reads each exported run once) and the next ones (which read only the index,
the queue and what is not finished) are timed apart.

Prints each ratio (goal: <= 1.5x).    python bench/bench_metrics.py [--runs 20000] [--rounds 30]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_many_runs import TPUCTL, plant  # noqa: E402

ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def scrape(url: str, token: str) -> tuple[float, int]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": ACCEPT})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def home_with(runs: int, keep: str) -> tuple[dict[str, str], float]:
    """A tpuctl home whose one local cluster's store holds `runs` finished runs (its state saved as `up` saves it;
    no agent: nothing runs)."""
    home = tempfile.mkdtemp()
    env = {**os.environ, "TPUCTL_HOME": home, "TPUCTL_CONFIG": "/nonexistent", "TPUCTL_METRICS_KEEP": keep,
           "TPUCTL_PRICE_PER_HOUR": "2"}
    os.environ["TPUCTL_HOME"] = home
    from tpuctl.core import state
    from tpuctl.core.models import ClusterSpec, ClusterState, Phase, ProviderName
    store = str(Path(home) / "store")
    state.save(ClusterState(spec=ClusterSpec(name="hist", provider=ProviderName.LOCAL, store=store),
                            phase=Phase.READY, periods=[[time.time() - 3600, 0.0]]))
    return env, plant(store, runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--keep", default="20")
    a = ap.parse_args()
    procs, urls, homes = {}, {}, []
    try:
        for label, n in (("few", 20), ("hist", a.runs)):
            env, took = home_with(n, a.keep)
            homes.append(env["TPUCTL_HOME"])
            print(f"{label}: planted {n} finished runs in {took:.1f} s")
            token = Path(env["TPUCTL_HOME"]) / "token"
            procs[label] = subprocess.Popen(TPUCTL + ["ui", "--metrics-only", "--token-file", str(token)], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            urls[label] = (procs[label].stdout.readline().strip(), token.read_text().strip())
        first = {label: scrape(*urls[label]) for label in ("few", "hist")}
        times: dict[str, list[float]] = {"few": [], "hist": []}
        sizes = {}
        for i in range(a.rounds):
            for label in (("few", "hist") if i % 2 else ("hist", "few")):
                took, sizes[label] = scrape(*urls[label])
                times[label].append(took)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"first scrape: 20 runs {first['few'][0] * 1000:.1f} ms, {a.runs} runs {first['hist'][0] * 1000:.1f} ms"
              f" ({first['hist'][0] / first['few'][0]:.2f}x)")
        print(f"scrapes after (median of {a.rounds}): 20 runs {med['few'] * 1000:.1f} ms, {a.runs} runs "
              f"{med['hist'] * 1000:.1f} ms: ratio {med['hist'] / med['few']:.2f}x (goal <= 1.5x); bodies "
              f"{sizes['few']} and {sizes['hist']} bytes (TPUCTL_METRICS_KEEP={a.keep})")
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(20)
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
