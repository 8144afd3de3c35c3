"""`tpuctl --help` wall time against `python -c "import typer, rich"` (goal: ratio <= 1.5).

Nothing from google-cloud or TensorFlow may be imported to print help. Median of N runs of each, interleaved.
"""
import statistics
import subprocess
import sys
import time

N = 9


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    base_cmd = [sys.executable, "-c", "import typer, rich"]
    help_cmd = [sys.executable, "-m", "tpuctl", "--help"]
    timed(base_cmd), timed(help_cmd)  # warm the OS file cache
    base, help_ = [], []
    for _ in range(N):
        base.append(timed(base_cmd))
        help_.append(timed(help_cmd))
    b, h = statistics.median(base), statistics.median(help_)
    leaked = subprocess.run([sys.executable, "-c", "import sys, tpuctl.cli as c; c.app(['--help'], standalone_mode=False); "
                             "print(sorted(m for m in sys.modules if m.startswith(('google', 'tensorflow'))))"],
                            capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(f"import typer, rich : {b * 1000:7.0f} ms (median of {N})")
    print(f"tpuctl --help      : {h * 1000:7.0f} ms (median of {N})")
    print(f"ratio              : {h / b:7.2f}  (goal <= 1.5)")
    print(f"google/tensorflow modules imported for help: {leaked}")


if __name__ == "__main__":
    main()
