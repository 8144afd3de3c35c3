"""The everyday surface a new user trips over (issue 30, item 5): ports checked like every other input, plain
grammar, exit codes README documents, help that names every provider, durations in hours, and Ctrl-C of `watch`
saying what keeps running."""
import json
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import tpuctl_at_a_terminal
from jobs import make_job
from tpuctl.core.lifecycle import show_duration
from tpuctl.core.models import ProviderName


@pytest.mark.parametrize("port,said", [("99999", "--port 99999 is not a port"), ("0", "--port 0 is not a port"),
                                       ("taken", "cannot be used on 127.0.0.1")])
def test_tensorboard_refuses_a_bad_port_before_it_starts_anything(local_up, cli, port, said):
    pytest.importorskip("tensorboard")
    local_up("tb")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        if port == "taken":
            port = str(busy.getsockname()[1])
        started = time.monotonic()
        code, out, err = cli("tensorboard", "-c", "tb", "--port", port)
    assert code == 2 and said in err and "hint:" in err and out == "", err
    assert time.monotonic() - started < 5


def test_jobs_limit_1_says_the_latest_run(local_up, cli, tmp_path):
    local_up("one")
    job = make_job(tmp_path, "print('x')\n")
    for _ in range(2):
        assert cli("submit", str(job), "-c", "one")[0] == 0
    code, out, err = cli("jobs", "-c", "one", "--limit", "1")
    assert code == 0 and "the latest run;" in err and "1 runs" not in err


def test_download_of_an_unknown_run_exits_with_the_documented_not_found_code(local_up, cli):
    from pathlib import Path
    local_up("dl")
    code, out, err = cli("download", "20260101-000000-000-abcd", "-c", "dl")
    assert code == 3 and "no run 20260101-000000-000-abcd" in err
    codes = (Path(__file__).parent.parent / "docs" / "troubleshooting.md").read_text()
    assert "| 3 | not found: no such cluster or run" in codes


def test_every_provider_is_named_in_the_help_and_in_the_hint(env, cli):
    code, out, err = cli("logs", "--help")
    assert "gcp (default), local, kaggle or gke" in " ".join(out.split())
    code, out, err = cli("up", "--provider", "azure", "-c", "x")
    assert code == 2 and all(f"--provider {p.value}" in " ".join(err.split()) for p in ProviderName)


def test_durations_past_an_hour_read_in_hours():
    assert show_duration(525 * 60) == "8h45m"      # a Kaggle TPU session (9 h less the margin), not "525m"
    assert [show_duration(s) for s in (90, 1800, 7200, 86400, 5400)] == ["90s", "30m", "2h", "1d", "1h30m"]


def test_ctrl_c_of_watch_says_what_keeps_running_and_gives_the_lease_up(local_up, cli):
    code, out, err = cli("up", "--provider", "local", "-c", "lw", "--recover")
    assert code == 0, err
    # PYTHONFAULTHANDLER: a watch that does not end after the Ctrl-C (seen once, in a loaded CI run, not reproduced)
    # is made to print every thread's stack (SIGABRT), so the failure says where it stood
    p = subprocess.Popen(tpuctl_at_a_terminal("watch", "-c", "lw"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert "holding its lease" in p.stderr.readline()
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)
        out, err = p.communicate(timeout=30)
        raise AssertionError(f"watch still running 30 s after Ctrl-C; its stacks:\n{err[-6000:]}") from None
    assert p.returncode == 130 and "Traceback" not in err
    assert "stopped watching lw" in err and "keep running" in err and "tpuctl watch -c lw --detach" in err
    status = json.loads(cli("status", "-c", "lw", "--json")[1])
    assert status["watcher"].startswith("NONE holds the lease")


def test_a_ctrl_c_no_command_answers_itself_still_gets_a_line(env, cli, monkeypatch):
    """typer answers Ctrl-C with a silent Exit(130) (typer/core.py `_main`: `except KeyboardInterrupt: raise
    Exit(130)`), which `down` waiting on a watcher's lease, say, met with no word at all."""
    from tpuctl.control import inventory

    def pressed(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(inventory, "ls", pressed)
    code, out, err = cli("ls")
    assert code == 130 and "error: interrupted" in err and "run it again" in err


def test_a_ctrl_c_inside_the_local_stores_lock_does_not_leave_it_held(tmp_path, monkeypatch):
    """What hung a Ctrl-C'd `tpuctl watch` once in ~15 runs: the interrupt landed just after flock() returned, the
    descriptor was never closed, and the watcher giving its lease up on its way out then waited on its own lock."""
    import threading
    from tpuctl.core import store as store_mod
    s = store_mod.LocalStore(str(tmp_path / "s"))
    real = store_mod.fcntl.flock
    pressed = []

    def flock_then_ctrl_c(fd, op):
        real(fd, op)
        if not pressed:
            pressed.append(fd)
            raise KeyboardInterrupt
    monkeypatch.setattr(store_mod.fcntl, "flock", flock_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        s.write_if("lease", b"x", 0)
    done = []
    t = threading.Thread(target=lambda: done.append(s.read_generation("lease")), daemon=True)
    t.start()
    t.join(5)
    assert done == [(None, 0)], "the store's lock is still held by the interrupted call"


def _hint(err):
    return " ".join(line for line in err.splitlines() if line.startswith("hint:"))


def test_each_hint_names_the_next_step_for_what_the_user_was_doing(local_up, cli):
    """Issue 52: bare `up` on Google Cloud suggested --provider local; `down` of an unknown cluster suggested making
    it; `ls` with nothing, after only local clusters were used, suggested a Google Cloud TPU."""
    code, out, err = cli("up")
    assert code == 2 and "--type is required for a Google Cloud TPU" in err
    assert "`tpuctl up --type v5litepod-8 --zone us-west4-a -c default`" in _hint(err) and "--provider" not in err
    code, out, err = cli("down", "-c", "nosuch", "--yes")
    assert code == 3 and "nothing here to take down" in _hint(err) and "--project PROJECT" in _hint(err)
    assert "tpuctl up" not in err and "make" not in _hint(err)
    code, out, err = cli("ls")
    assert code == 0 and all(f"--provider {p}" in err for p in ("local", "kaggle", "gke")) and "--zone" in err
    local_up("demo")   # the quick start: a local cluster, then gone with its store
    assert cli("down", "-c", "demo", "--yes", "--delete-bucket")[0] == 0
    code, out, err = cli("ls")
    assert code == 0 and "`tpuctl up --provider local -c NAME` makes one" in err and "--zone" not in err, err
    local_up("kept")
    code, out, err = cli("down", "-c", "nosuch", "--yes")
    assert code == 3 and "`tpuctl ls` lists the clusters here" in _hint(err) and "tpuctl up" not in err
    assert "--project" not in err   # only local clusters here: no project holds one


@pytest.mark.parametrize("spelling", ["v5e-8", "v5litepod-8"])
def test_one_tpu_two_names_each_provider_takes_both(env, cli, spelling):
    """Issue 52: Kaggle took v5e-8 and Google Cloud v5litepod-8, each refusing the other's name for the same chips."""
    code, out, err = cli("up", "--type", spelling, "--zone", "us-west4-a", "--project", "my-proj", "--dry-run")
    assert code == 0 and "v5litepod-8 (8 chips, 1 host" in err, err
    code, out, err = cli("up", "--provider", "kaggle", "--type", spelling, "-c", "kg", "--dry-run")
    assert code == 0 and "TpuV5E8" in err, err
    gke = spelling.replace("-8", "-16")
    code, out, err = cli("up", "--provider", "gke", "--type", gke, "--zone", "us-west4-a", "--project", "my-proj",
                         "--dry-run", "-c", "g")
    assert code == 0 and "(v5litepod-16, 16 chips" in err, err


def test_a_v5e_kaggle_does_not_have_says_which_it_has(env, cli):
    code, out, err = cli("up", "--provider", "kaggle", "--type", "v5litepod-4", "-c", "kg", "--dry-run")
    assert code == 2 and "Kaggle's TPU is v5e-8 (v5litepod-8 on Google Cloud)" in err
    assert "hint: did you mean --type v5e-8?" in err


def test_a_file_given_as_the_job_folder_is_called_a_file(env, cli, tmp_path, monkeypatch):
    """Issue 52: `submit train.py` said "does not exist" of a file that plainly does."""
    job = make_job(tmp_path, "print(1)")
    for given, hint in ((job / "main.py", f"pass the folder instead: {job}"),
                        (job / "tpuctl.toml", f"pass the folder holding it: {job}")):
        code, out, err = cli("submit", str(given))
        assert code == 2 and f"{given} is a file, and JOB_DIR is the job's folder" in err and hint in err, err
        assert "does not exist" not in err
    monkeypatch.chdir(job)
    code, out, err = cli("notebook", "main.py")
    assert code == 2 and "main.py is a file" in err and "pass the folder instead: ." in err, err
    (tmp_path / "alone.py").write_text("print(1)")
    code, out, err = cli("submit", str(tmp_path / "alone.py"))
    assert code == 2 and 'tpuctl.toml saying command = "python alone.py"' in err, err


@pytest.mark.parametrize("args,said", [
    (("--provider", "local", "--type", "v3-8"), "--type does not apply to --provider local"),
    (("--provider", "local", "--type", "v3-8", "--zone", "us-central1-b"), "--type, --zone do not apply to"),
    (("--provider", "kaggle", "--zone", "us-central1-b"), "--zone does not apply to --provider kaggle"),
    (("--type", "v3-8", "--zone", "us-central1-b", "--image", "x"), "--image applies to --provider gke only")])
def test_a_refused_flag_is_named_in_plain_grammar(env, cli, args, said):
    """Issue 52: "--type do not apply" for one flag."""
    code, out, err = cli("up", "-c", "g", *args)
    assert code == 2 and said in err, err


def test_the_how_to_make_hint_follows_the_provider_the_user_set(env, cli, monkeypatch):
    monkeypatch.setenv("TPUCTL_PROVIDER", "kaggle")
    code, out, err = cli("ls")
    assert code == 0 and "`tpuctl up --provider kaggle --type v5e-8 -c NAME` makes one" in err, err
