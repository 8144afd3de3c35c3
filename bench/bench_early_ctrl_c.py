"""Ctrl-C in the first moments of `tpuctl` (issue 58.5: "0 tracebacks in 200 early Ctrl-Cs").

N presses (default 200) at moments spread evenly over the first WINDOW ms (default 100) after the start, each to a
fresh `tpuctl --version` started as a terminal starts it (tests/early_presses.py: its own process group, SIGINT at
its default, the press to the whole group). Run for the `tpuctl` command (launcher/tpuctl: the console script
started with SIGINT blocked) and for `tpuctl-python` (pip's console script alone: what `tpuctl` was before),
interleaved, so a load that comes and goes weighs on both. Prints, for each: tracebacks, presses lost (the command
went on to exit 0), exits 130, deaths by SIGINT, and the median start-to-exit time of a run left alone.

`python bench/bench_early_ctrl_c.py [N] [WINDOW_MS]` from the repository root, with the venv's tpuctl installed
(`pip install -e .`)."""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from early_presses import press, summary  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
WINDOW = (float(sys.argv[2]) if len(sys.argv) > 2 else 100) / 1000
BIN = os.path.dirname(sys.executable)
COMMANDS = {"tpuctl (launcher)": [os.path.join(BIN, "tpuctl"), "--version"],
            "tpuctl-python (pip's script alone)": [os.path.join(BIN, "tpuctl-python"), "--version"]}


def alone(argv):
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    env = dict(os.environ, TPUCTL_HOME=os.path.join("/tmp", f"bench-early-ctrl-c-{os.getpid()}"))
    got = {k: [] for k in COMMANDS}
    for i in range(N):
        for k, argv in COMMANDS.items():
            got[k].append(press(argv, WINDOW * i / N, env))
    for k, argv in COMMANDS.items():
        ms = statistics.median(alone(argv) for _ in range(9)) * 1000
        print(f"{k}: {summary(got[k])}\n  a run left alone: {ms:.0f} ms (median of 9)")


if __name__ == "__main__":
    main()
