"""A Ctrl-C while tpuctl is still importing typer, rich and its commands (issue 40: a raw KeyboardInterrupt
traceback in the first ~0.2 s), pressed as a user presses it: in a terminal (tmux), whose Ctrl-C sends SIGINT to
the foreground process."""
import os
import signal
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from early_presses import as_a_terminal_starts, campaign, summary

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


# The `tpuctl` console script as pip writes it (`tpuctl = "tpuctl.cli:main"`), with one import made slow (it writes
# `ready` and sleeps, so the SIGINT lands inside it): the module named in argv[2], either while it is imported (a
# press inside an import) or in an object's finalizer there (where Python ignores a KeyboardInterrupt: "Exception
# ignored in ...", and the command went on to exit 0).
CONSOLE_SCRIPT = """
import builtins, os, sys, time
ready, slow, how = sys.argv.pop(1), sys.argv.pop(1), sys.argv.pop(1)
real = builtins.__import__
class Finalized:
    def __del__(self):
        open(ready, "w").close()
        end = time.monotonic() + 5
        while time.monotonic() < end:
            pass
def hooked(name, *args, **kwargs):
    if name == slow and not os.path.exists(ready):
        if how == "import":
            open(ready, "w").close()
            time.sleep(5)
        else:
            Finalized()   # dropped at once: its __del__ runs here
    return real(name, *args, **kwargs)
builtins.__import__ = hooked
import re
from tpuctl.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


@pytest.mark.parametrize("slow, how", [
    ("typing", "import"),      # tpuctl.cli's own first import: before its main() had a guard (issue 52.7)
    ("typer", "import"),       # the commands' imports
    ("typer", "finalizer"),    # a press Python would ignore: `up` went on to exit 0
    ("typing", "finalizer"),
])
def test_ctrl_c_from_the_console_scripts_first_instruction_is_one_line_and_130(env, tmp_path, slow, how):
    script = tmp_path / "bin" / "tpuctl"   # its name: the guard is the console script's alone
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    ready = tmp_path / "ready"
    proc = subprocess.Popen(as_a_terminal_starts([sys.executable, str(script), str(ready), slow, how, "ls"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready.exists(), proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Exception ignored" not in err, err
    assert err.strip() == "error: interrupted while tpuctl was starting; nothing was done", err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")   # the press it ignores, on purpose
def test_a_press_python_ignored_inside_a_command_still_ends_it_130(local_up, cli, monkeypatch):
    """After the start the command answers a Ctrl-C; one raised where Python ignores it (a finalizer) is noted and
    the command that went on exits 130 with the interrupted line, never 0."""
    import tpuctl
    from tpuctl.control import inventory
    real = inventory.ls

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            end = time.monotonic() + 5
            while time.monotonic() < end:   # the handler runs here, between two bytecodes of this finalizer
                pass

    def ls(*args, **kwargs):
        Finalized()
        return real(*args, **kwargs)
    monkeypatch.setattr(inventory, "ls", ls)
    # as at a terminal: a suite run as a background job of a script starts with SIGINT ignored, which start_guard_off
    # rightly leaves alone (conftest.tpuctl_at_a_terminal)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, out, err = cli("ls")
    finally:
        signal.signal(signal.SIGINT, before)
    assert tpuctl.sigints and code == 130 and "error: interrupted" in err, (code, err)


IGNORED_PRESS = """
import os, signal, sys, time
import tpuctl
tpuctl.start_guard_off()   # as cli/entry.py does once its commands are loaded
class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        end = time.monotonic() + 5
        while time.monotonic() < end and not tpuctl.sigints:
            pass
Finalized()
print("noted", tpuctl.sigints, flush=True)
class Other:
    def __del__(self):
        raise ValueError("any other error in a finalizer is printed as Python prints it")
Other()
tpuctl.python_sigint()
"""


def test_a_press_python_would_print_as_ignored_is_noted_not_printed(tmp_path):
    """Issue 58.5: early Ctrl-Cs printed tracebacks; among them a press landing in a weakref callback of importlib's
    module locks (or any finalizer), which Python prints as "Exception ignored in ..." with its traceback. The press
    is noted (the command answers it as it returns) and nothing of it is printed; other such errors still are."""
    proc = subprocess.run(as_a_terminal_starts([sys.executable, "-c", IGNORED_PRESS]), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "noted [2]" in proc.stdout, (proc.stdout, proc.stderr)
    assert "KeyboardInterrupt" not in proc.stderr and "ValueError: any other error" in proc.stderr, proc.stderr


# Issue 58.5: "0 tracebacks in 200 early Ctrl-Cs" (bench/bench_early_ctrl_c.py presses 200 times; here 30). Most of
# them landed before any line of tpuctl ran: in Python's own start (site.py, the venv's .pth files, os, io) or in
# pip's console script (`import re`, `from tpuctl.cli import main`), where Python's KeyboardInterrupt was already
# installed. The `tpuctl` command is launcher/tpuctl, which starts the console script with SIGINT blocked.

@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """tpuctl as a plain `pip install .` lays it out (no dependencies: this Python has them), in a prefix of its
    own: its scripts folder holds what a user's PATH finds."""
    root = Path(__file__).resolve().parent.parent
    prefix = tmp_path_factory.mktemp("installed")
    # --ignore-installed: without it pip uninstalls the tpuctl this Python has (the checkout's editable install)
    # before installing into the prefix
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
                        "--no-build-isolation", "--prefix", str(prefix), str(root)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return prefix / "bin"


def test_pip_installs_the_launcher_as_tpuctl_beside_its_console_script(installed, env, tmp_path):
    root = Path(__file__).resolve().parent.parent
    launcher = installed / "tpuctl"
    assert launcher.read_bytes() == (root / "launcher" / "tpuctl").read_bytes()   # as is: no shebang rewritten
    assert os.access(launcher, os.X_OK) and os.access(installed / "tpuctl-python", os.X_OK)
    assert (installed / "tpuctl-python").read_text().splitlines()[0] == f"#!{sys.executable}"
    version = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == f"tpuctl {tpuctl_version()}", version
    linked = tmp_path / "elsewhere" / "tpuctl"   # pipx puts a link to it on PATH
    linked.parent.mkdir()
    linked.symlink_to(launcher)
    version = subprocess.run([str(linked), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == f"tpuctl {tpuctl_version()}", version


def tpuctl_version() -> str:
    import tpuctl
    return tpuctl.__version__


LAUNCHED_ENV = """
import os, signal, sys
sys.argv[0] = "tpuctl"
import tpuctl
print(os.environ.get("TPUCTL_LAUNCHER"), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []),
      signal.getsignal(signal.SIGINT) is tpuctl._interrupted_at_start, flush=True)
"""


def test_the_guard_unblocks_sigint_and_keeps_the_launchers_mark_from_what_tpuctl_starts(tmp_path):
    """Started by the launcher, SIGINT comes blocked: tpuctl's guard is installed, then SIGINT unblocked (a blocked
    one would never reach anything tpuctl starts either: the mask is inherited), and the launcher's variable is out
    of the environment."""
    proc = subprocess.run(as_a_terminal_starts([sys.executable, "-c", LAUNCHED_ENV], blocked=True),
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, TPUCTL_LAUNCHER="sigint-blocked"))
    assert proc.stdout.split() == ["None", "False", "True"], (proc.stdout, proc.stderr)


def test_a_press_while_python_starts_waits_for_the_guard_then_is_one_line_and_130(tmp_path):
    """A press made before Python's first line (here: before it was even started) is pending, not lost, and the
    guard answers it as it unblocks SIGINT."""
    proc = subprocess.run(as_a_terminal_starts(["sh", "-c", f"kill -INT $$; exec {sys.executable} -c 'import sys; "
                                                "sys.argv[0] = \"tpuctl\"; import tpuctl; print(\"went on\")'"],
                                               blocked=True),
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, TPUCTL_LAUNCHER="sigint-blocked"))
    assert proc.returncode == 130 and "went on" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.strip() == "error: interrupted while tpuctl was starting; nothing was done", proc.stderr


@pytest.mark.slow(20)
def test_ctrl_c_in_the_first_100_ms_of_tpuctl_is_never_a_traceback_nor_lost(installed, env):
    """30 presses spread over the first 100 ms of `tpuctl --version` (each started as a terminal starts it, the press
    to its process group): each ends it quietly, 130 or killed by the SIGINT. pip's console script alone printed
    a traceback for about a third of them (bench/bench_early_ctrl_c.py)."""
    argv = [str(installed / "tpuctl"), "--version"]
    # the window within the command's own run: a press as a quick `--version` exits (on a quiet machine ~95 ms in)
    # lands in Python's finalization, after the command did its work, and exits 0 by right
    started = time.monotonic()
    subprocess.run(as_a_terminal_starts(argv), capture_output=True, timeout=60, check=True)
    presses = campaign(argv, 30, min(0.1, 0.7 * (time.monotonic() - started)), dict(os.environ))
    sent = [p for p in presses if p.sent]
    assert len(sent) >= 10 and all(p.answered for p in sent), summary(presses)   # a fast machine ends sooner
