"""What a long history and a large log cost `tpuctl ui`'s pages, on the local provider, in interleaved rounds:

- the runs page of a cluster holding 20,000 finished runs against one holding 20 (planted as submit and the agent
  write them: bench_many_runs.plant): time to its first byte, and to the table drawn in Chromium;
- the run page of a run whose log is 100 MB (1,600 chunks of 64 KiB, as the agent ships them) against one whose log
  is a few lines: time to its first byte, and to its loss chart and its log's tail drawn.

Prints each ratio (goal: under 1.5x).    python bench/bench_ui.py [--runs 20000] [--rounds 10]
"""
import argparse
import json
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

CHUNK = 64 * 1024


def big_log(store_root: str, run_id: str, mb: int) -> None:
    from tpuctl.core import layout
    from tpuctl.core.store import LocalStore
    store = LocalStore(store_root)
    line = b"step 000000 loss 1.234567 " + b"x" * 37 + b"\n"   # 64 bytes
    chunk = line * (CHUNK // len(line))
    for n in range(1, mb * 2 ** 20 // CHUNK + 1):
        store.write(layout.log_chunk(run_id, 0, n), chunk)


def ttfb(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url) as r:
        r.read(1)
        took = time.perf_counter() - t0
        r.read()
    return took


def drawn(page, url: str, ready: str) -> float:
    """From asking for the page to `ready` (a JavaScript expression) holding in it."""
    t0 = time.perf_counter()
    page.goto(url, wait_until="commit")
    page.wait_for_function(ready, timeout=60000, polling="raf")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    home = tempfile.mkdtemp()
    # pages of 20 rows: both clusters' first page shows 20 runs, so the ratio is the history's cost alone
    os.environ.update(TPUCTL_HOME=home, TPUCTL_CONFIG="/nonexistent", TPUCTL_UI_POLL_SECONDS="60", TPUCTL_UI_PAGE="20")
    stores = {}
    for name in ("few", "hist"):
        subprocess.run(TPUCTL + ["up", "--provider", "local", "-c", name], check=True, capture_output=True)
        stores[name] = json.loads(subprocess.run(TPUCTL + ["status", "-c", name, "--json"], check=True,
                                                 capture_output=True, text=True).stdout)["store"]
    ui = None
    try:
        took = plant(stores["hist"], a.runs) + plant(stores["few"], 20)
        print(f"planted {a.runs} and 20 finished runs in {took:.1f} s")
        from tpuctl.core import runindex
        from tpuctl.core.store import LocalStore
        small, large = runindex.newest(LocalStore(stores["few"]), 2)
        t0 = time.perf_counter()
        big_log(stores["few"], large, 100)
        print(f"wrote run {large}'s 100 MB log in {time.perf_counter() - t0:.1f} s")
        ui = subprocess.Popen(TPUCTL + ["ui", "--no-browser"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
        url = ui.stdout.readline().strip()
        base, token = url.split("/?token=")
        table = "document.querySelectorAll('table.runs tbody tr').length > 0"
        chart_and_log = ("document.querySelector('#metric-loss canvas') !== null && "
                         "document.getElementById('log-text').textContent.length > 0")
        pages = {f"runs page, 20 vs {a.runs:,} runs": (f"{base}/runs?cluster=few", f"{base}/runs?cluster=hist", table),
                 "run page, small vs 100 MB log": (f"{base}/run/few/{small}", f"{base}/run/few/{large}",
                                                   chart_and_log)}
        from playwright.sync_api import sync_playwright
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"))
            page = browser.new_page()
            page.goto(url)
            times = {(label, k, which): [] for label in pages for k in ("first byte", "drawn") for which in (0, 1)}
            for _ in range(a.rounds):
                for label, (u0, u1, selector) in pages.items():
                    for which, u in enumerate((u0, u1)):
                        times[(label, "first byte", which)].append(ttfb(f"{u}{'&' if '?' in u else '?'}token={token}"))
                        times[(label, "drawn", which)].append(drawn(page, u, selector))
            browser.close()
        print(f"{'page':34} {'measure':10} {'baseline':>9} {'large':>9} {'ratio':>7}   (median of {a.rounds})")
        for label in pages:
            for k in ("first byte", "drawn"):
                b, l = (statistics.median(times[(label, k, w)]) for w in (0, 1))
                print(f"{label:34} {k:10} {b * 1000:7.0f}ms {l * 1000:7.0f}ms {l / b:6.2f}x")
        print("goal for each ratio: under 1.5x")
    finally:
        if ui is not None:
            ui.terminate()
            ui.wait(20)
        for name in stores:
            subprocess.run(TPUCTL + ["down", "-c", name, "--yes", "--delete-bucket"], capture_output=True)


if __name__ == "__main__":
    main()
