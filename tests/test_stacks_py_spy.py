"""host/stacks.py's second way in (issue 60 item 2, the stacks): a Python process of the job that did not import
tpuctl.runtime (no faulthandler file, no SIGUSR1 handler) gets `py-spy dump --pid PID --nonblocking` where py-spy is
installed. Once with the real py-spy (the test extras install it: a 3-MB wheel), once with a stand-in on PATH that
prints what py-spy 0.4.2 prints (its `dump` output, taken here from the real one: "Process PID: CMD", "Python vX.Y.Z
(EXE)", then per thread `Thread TID (idle|active|active+gil): "NAME"` and its frames, newest first, `    function
(file:line)`; benfred/py-spy README, "dump": "the current call stack for each python thread"), and its refusal where
ptrace is not allowed (README, "How do I run py-spy in Docker?": "Permission Denied: Try running again with elevated
permissions")."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tpuctl.host import stacks

HOLDING = """
import time, threading
def hold():
    print("ready", flush=True)
    time.sleep(60)
threading.Thread(target=lambda: time.sleep(60), name="loader", daemon=True).start()
hold()
"""


@pytest.fixture
def holding():
    """A Python process that imported nothing of tpuctl's, sleeping in `hold` (a thread `loader` beside it)."""
    p = subprocess.Popen([sys.executable, "-c", HOLDING], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == b"ready"
        yield p.pid
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def _only(path, monkeypatch):
    monkeypatch.setenv("PATH", f"{path}:/usr/bin:/bin")


def test_the_real_py_spy_dumps_a_process_without_tpuctl_runtime(holding, monkeypatch):
    exe = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    assert exe, "py-spy is in the test extras (pyproject.toml): pip install -e '.[test]'"
    _only(Path(exe).parent, monkeypatch)
    text = stacks.dump([holding], Path("/nonexistent"))   # a stacks dir without this process's file
    head = next(line for line in text.splitlines() if line.startswith("--- pid"))
    assert head.endswith("(py-spy dump --nonblocking)"), text
    assert 'Thread ' in text and '"MainThread"' in text and "hold (<string>:5)" in text, text
    assert '"loader"' in text, text


def test_the_py_spy_branch_with_a_stand_in_its_output_and_its_refusal(holding, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    spy = bin_dir / "py-spy"
    spy.write_text(textwrap.dedent("""\
        #!/bin/sh
        echo "$@" > "$(dirname "$0")/argv"
        if [ -e "$(dirname "$0")/refuse" ]; then
          echo "Permission Denied: Try running again with elevated permissions by going" \\
            "'sudo env \\"PATH=\\$PATH\\" !!'" >&2
          exit 1
        fi
        cat <<EOF
        Process $3: python train.py
        Python v3.11.7 (/usr/bin/python3.11)

        Thread $3 (idle): "MainThread"
            wait_forever (train.py:12)
            <module> (train.py:20)
        EOF
        """))
    spy.chmod(0o755)
    _only(bin_dir, monkeypatch)
    text = stacks.dump([holding], None)
    assert (bin_dir / "argv").read_text().split() == ["dump", "--pid", str(holding), "--nonblocking"]
    assert f"Process {holding}: python train.py" in text and "wait_forever (train.py:12)" in text, text
    assert "(py-spy dump --nonblocking)" in text
    (bin_dir / "refuse").write_text("")
    text = stacks.dump([holding], None)
    assert "(py-spy dump failed: Permission Denied: Try running again with elevated permissions" in text, text
    spy.unlink()
    text = stacks.dump([holding], None)
    assert "(no stack: the process did not import tpuctl.runtime, and py-spy is not installed)" in text, text
