"""Screenshot of `tpuctl tensorboard` showing a real run's loss curve, taken with headless Chromium.

    python bench/screenshot_tensorboard.py [--steps 60] [--out docs/tensorboard_loss.png]

Runs jobs/bert_pretrain (tiny preset) on the local provider in a throwaway TPUCTL_HOME, serves TensorBoard on it
through the CLI, screenshots the Time Series dashboard filtered to the loss, prints the PNG's path, and removes the
cluster. Needs `chromium` (apt install chromium). About two minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tpuctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpuctl", *args], env=env, text=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default=str(ROOT / "docs" / "tensorboard_loss.png"))
    a = ap.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not browser:
        sys.exit("no chromium on PATH: apt install chromium")
    home = tempfile.mkdtemp(prefix="tpuctl-shot-")
    env = dict(os.environ, TPUCTL_HOME=home, TPUCTL_PROVIDER="local")
    try:
        assert tpuctl("up", "-c", "shot", env=env).returncode == 0
        t = time.perf_counter()
        run = tpuctl("submit", str(ROOT / "jobs" / "bert_pretrain"), "-c", "shot", "--", "--preset", "tiny",
                     "--steps", str(a.steps), "--log-every", "5", env=env)
        print(f"run: exit {run.returncode} in {time.perf_counter() - t:.0f}s")
        print("\n".join(line for line in run.stdout.splitlines() if line.startswith("step ")))
        print(tpuctl("jobs", "-c", "shot", env=env).stdout)
        tb = subprocess.Popen([sys.executable, "-m", "tpuctl", "tensorboard", "-c", "shot"], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert tb.stdout is not None
        url = tb.stdout.readline().strip()
        try:
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--window-size=1280,800", "--virtual-time-budget=20000", f"--screenshot={a.out}",
                            f"{url}?darkMode=false#scalars&tagFilter=epoch_loss%7Cepoch_mlm_acc&_smoothingWeight=0"],
                           check=True, capture_output=True, timeout=120)
        finally:
            tb.terminate()
            tb.wait(20)
        print(f"screenshot: {a.out} ({Path(a.out).stat().st_size} bytes) of {url}")
    finally:
        tpuctl("down", "-c", "shot", "--yes", "--delete-bucket", env=env)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
