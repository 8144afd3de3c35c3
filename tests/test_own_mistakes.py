"""A user's own mistakes are said as one line and a hint, with the path or the requirement and the fix, never as
"internal error" (issue 63, item 4): each from a fresh HOME."""
import sys

import pytest

from jobs import make_job

OUTPUT_JOB = """
import os
open(os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "model.txt"), "w").write("weights")
"""


def said_once(code, err, exit_code, *words):
    """One error line, one hint, the exit code, no traceback; returns the error text on one line."""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    flat = " ".join(err.split())
    assert code == exit_code and len(errors) == 1 and err.count("hint:") == 1, err
    assert "internal error" not in err and "Traceback" not in err, err
    assert all(w in flat for w in words), err
    return flat


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("not a folder")
    return f


def test_notebook_output_into_a_missing_folder_makes_it(env, cli, tmp_path):
    target = tmp_path / "new" / "deeper" / "job.ipynb"
    code, out, err = cli("notebook", str(make_job(tmp_path, "print(1)\n")), "-o", str(target))
    assert code == 0 and target.is_file(), err


@pytest.mark.parametrize("where", ["below a file", "a folder"])
def test_notebook_output_that_cannot_be_written_says_where(env, cli, tmp_path, a_file, where):
    target = a_file / "job.ipynb" if where == "below a file" else tmp_path
    code, out, err = cli("notebook", str(make_job(tmp_path, "print(1)\n")), "-o", str(target))
    said_once(code, err, 2, f"-o {target}", *((f"{a_file} is a file, not a folder",) if where == "below a file"
                                              else ("is a folder", "name the notebook file")))


def test_download_to_a_path_that_cannot_be_made_says_where(local_up, cli, tmp_path, a_file):
    local_up("dl")
    assert cli("submit", str(make_job(tmp_path, OUTPUT_JOB)), "-c", "dl")[0] == 0
    code, out, err = cli("download", "-c", "dl", "-o", str(a_file / "sub"))
    said_once(code, err, 2, f"-o {a_file / 'sub'}", f"{a_file} is a file, not a folder")


@pytest.mark.parametrize("setting", ["TPUCTL_HOME", "HOME"])
def test_a_state_folder_that_is_a_file_is_said_with_its_setting(env, cli, monkeypatch, a_file, setting):
    if setting == "HOME":
        monkeypatch.delenv("TPUCTL_HOME")
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv(setting, str(a_file))
    code, out, err = cli("up", "-c", "h", "--provider", "local")
    said_once(code, err, 2, "tpuctl keeps its state in", str(a_file), "cannot use it",
              "point TPUCTL_HOME at a folder" if setting == "TPUCTL_HOME" else "set TPUCTL_HOME", )
    if setting == "HOME":
        assert "or fix HOME" in " ".join(err.split())


def test_kaggle_without_its_client_says_what_it_needs(env, cli, monkeypatch):
    """On Python 3.10 the kaggle extra installs nothing (pyproject.toml): `--provider kaggle` says the Python it
    needs, not ModuleNotFoundError: kagglesdk, even with a `kaggle auth login` file (whose refresh is a call)."""
    monkeypatch.setitem(sys.modules, "kagglesdk", None)   # what an import finds where the package is not installed
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    monkeypatch.setenv("KAGGLE_API_TOKEN", "tok")
    code, out, err = cli("up", "-c", "kg", "--provider", "kaggle", "--type", "v5e-8", "--yes")
    said_once(code, err, 2, "--provider kaggle needs Python 3.11 or newer", "this is Python 3.10")


def test_a_state_folder_you_may_not_write_is_said_with_the_fix(env, cli, monkeypatch):
    """As root (the tests' CI) no folder refuses a write: the refusal is made where the state file is written."""
    from tpuctl.core import state

    def refused(st):
        raise PermissionError(13, "Permission denied", str(state.home() / "clusters" / f"{st.name}.json"))
    monkeypatch.setattr(state, "save", refused)
    code, out, err = cli("up", "-c", "p", "--provider", "local")
    said_once(code, err, 2, "tpuctl keeps its state in", "Permission denied", "point TPUCTL_HOME at a folder")
