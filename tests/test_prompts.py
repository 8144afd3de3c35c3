"""Confirmation prompts as a person at a terminal meets them: the real CLI in a subprocess whose stdin is a pty."""
import os
import subprocess
import sys

from tpuctl.core import state
from tpuctl.providers.local import LocalProvider


def _at_terminal(args, answer, timeout=60):
    """Run `tpuctl ARGS` with a terminal on stdin, type `answer` and Enter; (exit code, stderr)."""
    master, slave = os.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "tpuctl", *args], stdin=slave, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        os.write(master, answer.encode() + b"\n")
        out, err = p.communicate(timeout=timeout)
        return p.returncode, err
    finally:
        os.close(master)
        os.close(slave)


def test_up_shows_its_choices_and_a_no_changes_nothing(cloud):
    code, err = _at_terminal(["up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "ask"], "n")
    assert "Create these resources? [y/N]" in err
    assert code == 1 and "nothing changed" in err
    assert cloud.mutating_calls() == [] and state.load("ask") is None


def test_up_says_there_are_no_credentials_before_asking(env, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "my-proj")    # no emulators: the real credential lookup, which fails
    code, err = _at_terminal(["up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "ask"], "y")
    assert code == 5, err
    assert "credentials" in err and "Create these resources" not in err


def test_declining_down_keeps_the_cluster(local_up):
    st = local_up("keep")
    code, err = _at_terminal(["down", "-c", "keep"], "no")
    assert "[y/N]" in err and code == 1 and "nothing changed" in err
    assert LocalProvider().agent_alive(st) and state.load("keep") is not None
