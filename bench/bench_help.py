"""`tpuctl --help` and `tpuctl COMMAND --help` against `python -c "import typer, rich.console"` (goal: ratio <= 1.3).

Nothing that only a command's body needs may be imported to print help (tests/test_help_imports.py holds the list).
Median of N runs of each, interleaved, so a load that comes and goes weighs on all alike. Each run is timed twice:
wall time, and the CPU time (user + system) the child used, which a machine shared with other work inflates far
less than wall time. `python bench/bench_help.py [N]`.
"""
import os
import statistics
import subprocess
import sys
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 9
BASE = [sys.executable, "-c", "import typer, rich.console"]
HELPS = {"tpuctl --help": ["--help"], "tpuctl up --help": ["up", "--help"],
         "tpuctl submit --help": ["submit", "--help"], "tpuctl notify test --help": ["notify", "test", "--help"]}


def timed(cmd):
    """(wall seconds, CPU seconds) of one run of cmd."""
    before = os.times()
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def main():
    cmds = {"import typer, rich.console": BASE, **{k: [sys.executable, "-m", "tpuctl", *v] for k, v in HELPS.items()}}
    for cmd in cmds.values():
        timed(cmd)   # warm the OS file cache
    got = {k: [] for k in cmds}
    for _ in range(N):
        for k, cmd in cmds.items():
            got[k].append(timed(cmd))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in got.items()}
    bw, bc = med["import typer, rich.console"]
    print(f"{'':28} {'wall ms':>8} {'ratio':>6}   {'CPU ms':>7} {'ratio':>6}   (median of {N}; goal ratio <= 1.3)")
    for k, (w, c) in med.items():
        print(f"{k:28} {w * 1000:8.0f} {w / bw:6.2f}   {c * 1000:7.0f} {c / bc:6.2f}")


if __name__ == "__main__":
    main()
