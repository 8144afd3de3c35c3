"""The local provider through the real CLI: up, submit, logs, jobs, cancel, down, with a real detached agent."""
import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import kill_dead, tpuctl_at_a_terminal, until
from jobs import ENV_JOB, FIDELITY_JOB, SLEEP_JOB, fidelity_expected, make_job, make_wheel
from tpuctl.core import state
from tpuctl.core.models import ProviderName
from tpuctl.providers.local import LocalProvider


@pytest.fixture
def local(local_up):
    return local_up("loc")


def test_up_is_idempotent_and_restarts_a_dead_agent(local, cli):
    pid = local.host.pid
    assert LocalProvider().agent_alive(local)
    assert cli("up", "--provider", "local", "-c", "loc")[0] == 0
    assert state.load("loc").host.pid == pid  # no second agent
    kill_dead(pid)
    code, out, err = cli("status", "-c", "loc", "--json")
    assert json.loads(out)["resources"]["agent"]["state"] == "DEAD"
    code, out, err = cli("up", "--provider", "local", "-c", "loc")
    assert code == 0 and "restarting" in err
    assert state.load("loc").host.pid != pid
    assert LocalProvider().agent_alive(state.load("loc"))


def test_submit_runs_streams_and_returns_exit_code(local, cli, tmp_path):
    job = make_job(tmp_path, ENV_JOB, 'data = ["corpus.txt"]\n[env]\nGREETING = "hi"\nEXIT = "3"\n')
    (job / "corpus.txt").write_text("hangul 한국어 text\n")
    code, out, err = cli("submit", str(job), "-c", "loc", "--", "--steps", "5")
    assert code == 3, err
    first = json.loads(out.splitlines()[0])
    assert first["TPUCTL_ACCELERATOR"] == "cpu" and first["TPUCTL_TPU"] == ""
    assert first["GREETING"] == "hi" and first["argv"] == ["--steps", "5"]
    assert "corpus: hangul 한국어 text" in out
    run_id = first["TPUCTL_RUN_ID"]
    out_dir = Path(first["TPUCTL_OUTPUT_DIR"])
    assert (out_dir / "model.txt").read_text() == "weights"
    assert str(out_dir).startswith(local.spec.store)
    code, logs_out, _ = cli("logs", "-c", "loc")
    assert logs_out == out  # reattach later: the same bytes
    code, jobs_out, _ = cli("jobs", "-c", "loc", "--json")
    row = json.loads(jobs_out)[0]
    assert row["id"] == run_id and row["state"] == "failed" and row["exit_code"] == 3 and row["name"] == "job"


def test_resubmitting_unchanged_data_uploads_nothing(local, cli, tmp_path):
    job = make_job(tmp_path, "print('ok')\n", 'data = ["d"]\n')
    (job / "d").mkdir()
    for i in range(5):
        (job / "d" / f"f{i}.bin").write_bytes(os.urandom(1000 + i))
    code, out, err = cli("submit", str(job), "-c", "loc")
    assert code == 0 and "5 of 5 files sent" in err
    code, out, err = cli("submit", str(job), "-c", "loc")
    assert code == 0 and "0 of 5 files sent" in err and "package" in err and "unchanged" in err
    (job / "d" / "f2.bin").write_bytes(b"changed")
    code, out, err = cli("submit", str(job), "-c", "loc", "--detach")
    assert "1 of 5 files sent" in err
    assert (Path(local.spec.store) / "runs" / out.strip() / "data/d/f2.bin").read_bytes() == b"changed"


def test_log_fidelity_every_byte_once_in_order(local, cli, tmp_path):
    job = make_job(tmp_path, FIDELITY_JOB)
    code, followed, err = cli("submit", str(job), "-c", "loc")
    assert code == 0, err
    expected = fidelity_expected()
    assert followed == expected.decode()
    code, later, _ = cli("logs", "-c", "loc")
    assert later == expected.decode()


def test_cancel_and_detach(local, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_CANCEL_GRACE", "2")
    job = make_job(tmp_path, SLEEP_JOB)
    code, out, err = cli("submit", str(job), "-c", "loc", "--detach")
    assert code == 0
    run_id = out.strip()
    until(lambda: json.loads(cli("jobs", "-c", "loc", "--json")[1])[0]["state"] == "running", 20, "the run running")
    assert cli("cancel", run_id, "-c", "loc")[0] == 0
    code, out, err = cli("logs", run_id, "-c", "loc", "-f")
    assert "started" in out
    assert code == 128 + signal.SIGTERM, err
    row = json.loads(cli("jobs", "-c", "loc", "--json")[1])[0]
    assert row["state"] == "cancelled"
    code, out, err = cli("cancel", run_id, "-c", "loc")
    assert code == 2 and "already cancelled" in err


def test_down_stops_exactly_the_agent(local, cli):
    pid = local.host.pid
    code, out, err = cli("down", "-c", "loc", "--yes")
    assert code == 0, err
    assert not LocalProvider().agent_alive(local)
    with pytest.raises(ProcessLookupError):   # the process itself is gone, not only unrecognisable
        os.kill(pid, 0)
    assert Path(local.spec.store).is_dir()  # the store's outputs are kept
    assert state.load("loc").phase.value == "down"
    assert cli("up", "--provider", "local", "-c", "loc")[0] == 0
    assert cli("down", "-c", "loc", "--yes", "--delete-bucket")[0] == 0
    assert not Path(local.spec.store).exists()
    assert state.load("loc") is None


def test_logs_jobs_and_ls_after_down_then_the_store_goes(local, cli, tmp_path):
    job = make_job(tmp_path, 'import os; print("trained"); open(os.environ["TPUCTL_OUTPUT_DIR"] + "/w", "w").write("x")')
    code, out, err = cli("submit", str(job), "-c", "loc")
    assert code == 0 and "trained" in out, err
    assert cli("down", "-c", "loc", "--yes")[0] == 0
    code, out, err = cli("logs", "-c", "loc")
    assert code == 0 and out == "trained\n", err
    code, out, err = cli("jobs", "-c", "loc", "--json")
    assert code == 0 and json.loads(out)[0]["state"] == "succeeded"
    code, out, err = cli("ls", "--json")
    row = json.loads(out)[0]
    assert row["phase"] == "down" and row["store_bytes"] > 0
    code, out, err = cli("ls")
    assert "down" in out and "kept" in out
    code, out, err = cli("status", "-c", "loc")
    assert code == 0 and "tpuctl up -c loc" in err and "DEAD" not in out
    code, out, err = cli("submit", str(job), "-c", "loc")
    assert code == 3 and "is down" in err and "tpuctl up -c loc" in err
    code, out, err = cli("down", "-c", "loc", "--yes")
    assert code == 0 and "already down" in err and Path(local.spec.store).is_dir()
    code, out, err = cli("down", "-c", "loc", "--yes", "--delete-bucket")
    assert code == 0, err
    assert not Path(local.spec.store).exists() and state.load("loc") is None
    assert cli("logs", "-c", "loc")[0] == 3


def test_status_names_a_dead_agent_and_the_command_that_restarts_it(local, cli):
    LocalProvider()._stop(local, lambda s: None)
    code, out, err = cli("status", "-c", "loc")
    assert code == 0
    assert "agent" in err and "not running" in err and "fix: tpuctl up -c loc --provider local" in err
    info = json.loads(cli("status", "-c", "loc", "--json")[1])
    assert "not running" in info["problem"] and info["fix"] == "tpuctl up -c loc --provider local"
    assert cli("up", "--provider", "local", "-c", "loc")[0] == 0
    assert json.loads(cli("status", "-c", "loc", "--json")[1])["problem"] == ""


def test_down_does_not_kill_a_reused_pid(env, cli):
    assert cli("up", "--provider", "local", "-c", "loc")[0] == 0
    st = state.load("loc")
    LocalProvider()._stop(st, lambda s: None)
    st.host.pid = os.getpid()  # a pid that is alive but is not the agent
    state.save(st)
    assert cli("down", "-c", "loc", "--yes")[0] == 0  # and we are still here


@pytest.mark.parametrize("setup,args,code,expect", [
    (None, ["submit", "nowhere", "-c", "loc"], 2, "does not exist"),
    ("", ["submit", "{job}", "-c", "loc"], 2, "has no tpuctl.toml"),
    ('command = "x"\ncolour = 1\n', ["submit", "{job}", "-c", "loc"], 2, "unknown key 'colour'"),
    ('command = 5\n', ["submit", "{job}", "-c", "loc"], 2, "'command' must be a str"),
    ('name = "x"\n', ["submit", "{job}", "-c", "loc"], 2, "'command' is required"),
    ('command = "x"\ndata = ["missing.txt"]\n', ["submit", "{job}", "-c", "loc"], 2, "missing.txt does not exist"),
    ('command = "x"\n', ["submit", "{job}", "-c", "loc", "--data", "/no/such"], 2, "/no/such does not exist"),
    ('command = "x"\nrequirements = "req.txt"\n', ["submit", "{job}", "-c", "loc"], 2, "req.txt does not exist"),
    ('command = "x"\n', ["submit", "{job}", "-c", "other"], 3, "no cluster named 'other'"),
    ('command = "x"\n', ["logs", "nope", "-c", "loc"], 2, "'nope' is not a run id"),
    ('command = "x"\n', ["logs", "20260101-000000-abcd", "-c", "loc"], 3, "no run 20260101-000000-abcd"),
])
def test_bad_submit_inputs_upload_nothing(local, cli, tmp_path, setup, args, code, expect):
    job = tmp_path / "j"
    if setup is not None:
        job.mkdir()
        if setup:
            (job / "tpuctl.toml").write_text(setup)
    c, out, err = cli(*[a.replace("{job}", str(job)) for a in args])
    assert c == code, err
    assert expect in err and "hint:" in err and "Traceback" not in err
    store = Path(local.spec.store)
    assert not (store / "tpuctl" / "packages").exists() and not (store / "tpuctl" / "runs").exists()


@pytest.fixture
def legacy_keras_shell(monkeypatch):
    """A shell (or a TPU VM image) that exports TF_USE_LEGACY_KERAS=1, set before the local agent starts: the agent
    inherits it, and a Keras 3 job must not (core/backends.keep_keras_3; a suite run failed this way when another
    test had left it in the process)."""
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")


@pytest.mark.slow(85)
def test_bert_quick_start_on_the_local_provider(legacy_keras_shell, local, cli):
    """The README's first command, through the CLI: the real job, generated corpus, a loss that falls by over a
    nat between the first and the last line (issue 13)."""
    job = Path(__file__).parent.parent / "jobs" / "bert_pretrain"
    code, out, err = cli("submit", str(job), "-c", "loc", "--", "--preset", "tiny", "--steps", "30",
                         "--log-every", "10")
    assert code == 0, out[-3000:] + err[-2000:]
    assert "generated 2.0 MB Hangul/Latin sample" in out
    assert "absl::InitializeLog" not in out and "cuInit" not in out and "cpu_feature_guard" not in out
    losses = [float(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]
    assert len(losses) == 3 and losses[-1] <= losses[0] - 1.0, losses
    assert list(Path(local.spec.store).glob("runs/*/output/checkpoints/ckpt-30*"))
    assert list(Path(local.spec.store).glob("prepared/bert_pretrain-128/part-*.tfrecord"))
    [row] = json.loads(cli("jobs", "-c", "loc", "--json")[1])     # metrics.json, from tpuctl.runtime's callback
    assert row["step"] == 30 and abs(row["loss"] - losses[-1]) < 1e-3 and len(row["loss_curve"]) == 3
    code, table, _ = cli("jobs", "-c", "loc")
    assert f"{losses[-1]:.4f}" in table and row["loss_curve"] in table


def test_ctrl_c_stops_following_not_the_run(local, cli, tmp_path):
    import subprocess
    job = make_job(tmp_path, SLEEP_JOB)
    p = subprocess.Popen(tpuctl_at_a_terminal("submit", str(job), "-c", "loc"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "started\n"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "keeps running on cluster loc" in err and "tpuctl logs" in err and "-f" in err and "Traceback" not in err
    row = json.loads(cli("jobs", "-c", "loc", "--json")[1])[0]
    assert row["state"] == "running"
    assert cli("cancel", row["id"], "-c", "loc")[0] == 0


def test_provider_from_the_environment(env, cli, monkeypatch):
    monkeypatch.setenv("TPUCTL_PROVIDER", "local")
    code, out, err = cli("up", "-c", "envp")
    assert code == 0, err
    st = state.load("envp")
    assert st.spec.provider is ProviderName.LOCAL
    assert cli("down", "-c", "envp", "--yes")[0] == 0


def test_job_requirements_get_their_own_environment_cached_by_hash(local, cli, tmp_path):
    """A job pinning another version of a package tpuctl's environment holds (six) gets it; tpuctl's own stays;
    the job still imports the host's TensorFlow stack and tpuctl.runtime; a second run installs nothing."""
    import importlib.metadata
    import subprocess
    import sys
    before = importlib.metadata.version("six")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "six", "0.0.1", "__version__ = '0.0.1'\n")
    job = make_job(tmp_path, "import six, numpy, tpuctl.runtime, sys\nprint('six', six.__version__, sys.prefix)\n",
                   'requirements = "req.txt"\n')
    (job / "req.txt").write_text(f"--no-index\n--find-links {wheels}\nsix==0.0.1\n")
    code, out, err = cli("submit", str(job), "-c", "loc")
    assert code == 0, out + err
    line = next(x for x in out.splitlines() if x.startswith("six "))
    assert line.split()[1] == "0.0.1" and "/envs/" in line.split()[2]
    now = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; print(m.version('six'))"],
                         capture_output=True, text=True).stdout.strip()
    assert now == before                                      # tpuctl's own environment is untouched
    code, out, err = cli("submit", str(job), "-c", "loc")
    assert code == 0 and "requirements already installed" in out and "six 0.0.1" in out


def test_requirements_install_beside_a_pinned_tensorflow(local, cli, tmp_path):
    job = make_job(tmp_path, "import numpy\nprint('numpy', numpy.__version__)\n", 'requirements = "req.txt"\n')
    (job / "req.txt").write_text("numpy\n")
    code, out, err = cli("submit", str(job), "-c", "loc")
    assert code == 0, out + err
    assert out.startswith("numpy ") or "\nnumpy " in out
    cons = list(Path(local.spec.store).parent.glob("work/runs/*/w0/constraints.txt"))
    assert cons and "tensorflow==" in cons[0].read_text()


def test_down_stops_a_running_job_too(local, cli, tmp_path):
    job = make_job(tmp_path, SLEEP_JOB)
    run_id = cli("submit", str(job), "-c", "loc", "--detach")[1].strip()
    store = Path(local.spec.store)
    status = store / "tpuctl" / "runs" / run_id / "status.json"
    until(lambda: status.exists() and json.loads(status.read_text())["state"] == "running", 20, "the run running")
    pid = json.loads(status.read_text())["pid"]
    assert cli("down", "-c", "loc", "--yes")[0] == 0
    until(lambda: not Path(f"/proc/{pid}").exists(), 10, "the job's end: it outlived its agent")
    # not cancelled by the agent's stop (issue 28): ended by `down`, its time and cost stopped, off the queue
    final = json.loads(status.read_text())
    assert final["state"] == "ended" and final["note"] == "cluster taken down (`tpuctl down`)", final
    assert final["ended"] and final["ended"] <= time.time()
    assert not (store / "tpuctl" / "queue" / run_id).exists()
    code, out, err = cli("jobs", "-c", "loc", "--json")
    row = json.loads(out)[0]
    assert code == 0 and row["state"] == "ended" and row["note"] == final["note"]
    took = row["duration"]
    time.sleep(1.1)
    assert json.loads(cli("jobs", "-c", "loc", "--json")[1])[0]["duration"] == took   # no longer growing


def test_ls_lists_local_clusters_when_the_cloud_cannot_be_asked(local, cli, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "some-proj")
    from google.auth.exceptions import DefaultCredentialsError

    def no_creds(*a, **k):
        raise DefaultCredentialsError("none")
    monkeypatch.setattr("google.auth.default", no_creds)
    code, out, err = cli("ls", "--json")
    assert code == 0, err
    assert [r["cluster"] for r in json.loads(out)] == ["loc"]
    assert "could not list gcp resources in project some-proj" in err


def test_cloud_flags_are_refused_for_the_local_provider(env, cli):
    code, out, err = cli("up", "--provider", "local", "-c", "x", "--type", "v3-8", "--zone", "us-central1-b")
    assert code == 2 and "--type, --zone do not apply to --provider local" in err
    assert state.load("x") is None


def test_without_proc_the_agents_command_line_comes_from_a_bounded_ps(tmp_path, monkeypatch):
    """macOS has no /proc: the local provider asks `ps` for the agent's command line, and a ps that never answers
    (a wedged process table) gives up within its bound (5 s; core/bounded.run_bounded) instead of hanging
    `status`, `down` and the revive every command runs first."""
    import builtins
    import os as os_
    from tpuctl.core import bounded as bounded_mod
    from tpuctl.providers import local
    real_open = builtins.open

    def no_proc(path, *a, **kw):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **kw)
    monkeypatch.setattr(builtins, "open", no_proc)
    monkeypatch.setattr(local.Path, "read_bytes", lambda self: (_ for _ in ()).throw(FileNotFoundError(self)))
    assert "pytest" in local._cmdline(os_.getpid()) or "python" in local._cmdline(os_.getpid())
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ps").write_text("#!/bin/sh\nsleep 60\n")
    (bin_ / "ps").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os_.environ['PATH']}")
    bounded = bounded_mod.run_bounded
    monkeypatch.setattr(bounded_mod, "run_bounded", lambda cmd, within, **kw: bounded(cmd, min(within, 0.5), **kw))
    started = time.monotonic()
    assert local._cmdline(os_.getpid()) == ""
    assert time.monotonic() - started < 10
