"""A Ctrl-C while tpuctl is still importing typer, rich and its commands (issue 40: a raw KeyboardInterrupt
traceback in the first ~0.2 s), pressed as a user presses it: in a terminal (tmux), whose Ctrl-C sends SIGINT to
the foreground process."""
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

# The import that takes the Ctrl-C is made slow (1 s), so the keypress lands inside it every time.
SLOW_START = """
import builtins, sys, time
real = builtins.__import__
def slow(name, *args, **kwargs):
    if name == "typer":
        time.sleep(float(sys.argv[1]))
    return real(name, *args, **kwargs)
builtins.__import__ = slow
from tpuctl.cli import main
main(["ls"])
"""


def _tmux(socket: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_ctrl_c_while_tpuctl_imports_is_one_line(env, tmp_path):
    script = tmp_path / "start.py"
    script.write_text(SLOW_START)
    done = tmp_path / "rc"
    socket = f"tpuctl-test-{uuid.uuid4().hex[:8]}"   # a tmux server of this test's own (tests run in parallel)
    command = f"{sys.executable} {script} 1.0; echo $? > {done}; sleep 60"   # the pane stays to be read
    passed = [f"{k}={os.environ[k]}" for k in ("TPUCTL_HOME", "TPUCTL_CONFIG", "PATH", "HOME") if k in os.environ]
    started = _tmux(socket, "new-session", "-d", "-s", "t", "-x", "200", "-y", "50",
                    *[a for kv in passed for a in ("-e", kv)], command)
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 20
        time.sleep(0.5)                                   # well inside the slow import
        assert _tmux(socket, "send-keys", "-t", "t", "C-c").returncode == 0
        while not (done.exists() and done.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        text = _tmux(socket, "capture-pane", "-p", "-t", "t").stdout
        assert done.exists(), text
        rc = done.read_text().strip()
    finally:
        _tmux(socket, "kill-server")
    assert rc == "130", text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "interrupted while tpuctl was starting" in text, text
