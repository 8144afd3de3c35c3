"""Runs that can never start (issue 38.3): refused at submit before anything is uploaded where tpuctl can know (a
NUL byte, a string over the kernel's limit for one argument), and failed at once on the host, the reason in the
log and in `jobs`, where it cannot (a job.json an older tpuctl wrote). Before, each stayed `starting` for ever and
`submit` followed it for ever."""
import json

import pytest

from conftest import until
from jobs import make_job


def _rows(cli, name):
    return json.loads(cli("jobs", "-c", name, "--json")[1])


@pytest.mark.parametrize("toml, said", [
    ('command = "python main.py\\u0000"\n', "the command holds a NUL byte"),
    ('command = "python main.py"\n[env]\nX = "a\\u0000b"\n', "[env] X holds a NUL byte"),
    ('command = "python main.py"\n[env]\nBIG = "' + "x" * 200_000 + '"\n', "[env] BIG is 200004 bytes"),
    ('command = "python main.py # ' + "y" * 200_000 + '"\n', "the command is 200017 bytes"),
], ids=["nul-command", "nul-env", "big-env", "big-command"])   # pytest puts a test's id in PYTEST_CURRENT_TEST: a
# 200 kB id made that variable too long for the agent `up` starts (E2BIG) under pytest 9.1
def test_what_no_host_could_start_is_refused_at_submit_before_anything_is_uploaded(local_up, cli, tmp_path, toml,
                                                                                    said):
    st = local_up("ns")
    job = make_job(tmp_path, "print('never')")
    (job / "tpuctl.toml").write_text(toml)
    for dry in ([], ["--dry-run"]):
        code, out, err = cli("submit", str(job), "-c", "ns", "--detach", *dry)
        assert code == 2 and said in err and "hint:" in err and "Traceback" not in err, err
    assert _rows(cli, "ns") == []
    from tpuctl.core import layout
    from tpuctl.core.store import LocalStore
    assert LocalStore(st.spec.store).list(layout.JOB_PACKAGE_PREFIX) == []   # nothing uploaded


def test_an_argument_with_a_nul_is_refused_too(local_up, cli, tmp_path):
    local_up("na")
    code, out, err = cli("submit", str(make_job(tmp_path, "print('x')")), "-c", "na", "--detach", "--", "a\0b")
    assert code == 2 and "argument 1 holds a NUL byte" in err


def test_a_run_the_host_cannot_start_fails_at_once_with_the_reason(local_up, cli, tmp_path, monkeypatch):
    """A job.json with a NUL in its command, as a submit without the check wrote one: the agent fails the run."""
    from tpuctl.control import submission
    from tpuctl.core import jobspec
    local_up("nh")
    monkeypatch.setattr(jobspec, "check_launchable", lambda *a: None, raising=False)
    monkeypatch.setattr(submission, "check_launchable", lambda *a: None, raising=False)
    job = make_job(tmp_path, "print('never')")
    (job / "tpuctl.toml").write_text('command = "python main.py\\u0000"\n')
    code, out, err = cli("submit", str(job), "-c", "nh", "--detach")
    assert code == 0, err
    until(lambda: _rows(cli, "nh")[0]["state"] == "failed", 15, "the run failed")
    [row] = _rows(cli, "nh")
    assert row["exit_code"] == 127 and "cannot start the job" in row["note"] and "null byte" in row["note"], row
    code, out, err = cli("logs", row["id"], "-c", "nh")
    assert "cannot start the job: ValueError: embedded null byte" in out


def test_an_env_path_without_bash_does_not_keep_the_run_from_starting(local_up, cli, tmp_path):
    local_up("np")
    job = make_job(tmp_path, "print('ran')", '[env]\nPATH = "/nonexistent"\n')
    code, out, err = cli("submit", str(job), "-c", "np", "--detach")
    assert code == 0, err
    until(lambda: _rows(cli, "np")[0]["state"] in ("succeeded", "failed"), 20, "the run's end")
    assert _rows(cli, "np")[0]["state"] == "succeeded" and "ran" in cli("logs", "-c", "np")[1]
