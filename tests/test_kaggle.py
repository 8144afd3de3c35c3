"""--provider kaggle against the wire-level fake Kaggle (tests/fakes/kaggle.py), through the real kagglesdk client:
credentials, quota, a run chained across sessions cut at their time limit, logs, jobs, download, re-submits that
upload nothing, cancel, and `down` leaving nothing of tpuctl's on Kaggle."""
import json
import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from conftest import tpuctl_at_a_terminal, until
from jobs import make_job

KEY = "k" * 32
JOB = Path(__file__).parent.parent / "jobs" / "bert_pretrain"
KERAS_JOB = Path(__file__).parent / "keras_job"

# Counts to 16, a quarter second a step, keeping its progress in TPUCTL_OUTPUT_DIR as a checkpoint would.
COUNTER = """
import os, time
ck = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "step")
start = int(open(ck).read()) if os.path.exists(ck) else 0
print("resuming at", start, "on", os.environ["TPUCTL_ACCELERATOR"], flush=True)
for step in range(start + 1, 17):
    time.sleep(0.25)
    open(ck + ".new", "w").write(str(step))   # then renamed: a kill at any moment leaves a whole checkpoint
    os.replace(ck + ".new", ck)
    print("step", step, flush=True)
print("done", flush=True)
"""
# The tpuctl.toml of a plain-Python job on a TPU (COUNTER, the sleepers): run as a JAX job (the TPU image's own
# stack), so that no session spends its time installing a TensorFlow the job never imports. That a TensorFlow
# job's every session installs its TensorFlow is the issue check's (two sessions) and
# test_a_tensorflow_job_on_the_tpu_gets_a_tensorflow_that_drives_it's.
ON_TPU = 'framework = "jax"\n'


@pytest.fixture(scope="session")
def _fake_kaggle(tmp_path_factory):
    from fakes.kaggle import FakeKaggle
    fake = FakeKaggle(tmp_path_factory.mktemp("kaggle"))
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def kaggle(_fake_kaggle, env, monkeypatch, tmp_path, wheel_index):
    _fake_kaggle.reset()
    _fake_kaggle.session_env = {"TPUCTL_TF_FIND_LINKS": wheel_index.url, "PIP_FIND_LINKS": wheel_index.url,
                                "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for k, v in _fake_kaggle.env().items():   # kagglesdk's TEST endpoint, through the fake on its own port
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(tmp_path / "kaggle-config"))
    monkeypatch.setenv("KAGGLE_USERNAME", "alice")
    monkeypatch.setenv("KAGGLE_KEY", KEY)
    monkeypatch.setenv("TPUCTL_KAGGLE_POLL", "0.05")
    monkeypatch.setenv("TPUCTL_LOG_POLL_MAX", "0.1")
    monkeypatch.setenv("TPUCTL_KAGGLE_GRACE_SECONDS", "0.2")
    yield _fake_kaggle
    assert _fake_kaggle.errors == []


def _up(cli, *flags):
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg", *flags)
    assert code == 0, err
    return err


def _down(cli, kaggle):
    """`down` ends well and leaves nothing on Kaggle."""
    code, out, err = cli("down", "-c", "kg", "--yes")
    assert code == 0, err
    assert kaggle.leftovers() == []


def _downloaded(cli, tmp_path):
    """The run's output as `tpuctl download` brings it."""
    assert cli("download", "-c", "kg", "-o", str(tmp_path / "got"))[0] == 0
    return tmp_path / "got"


# -- Kaggle's API as it is (issue 29 items 1, 4-7, 9, 10; issue 28 item 4) ------------------------------------------

# Counts to 16 as COUNTER does, over two sessions at least: the first says a line, waits (15 s at most) for the test
# to have seen that line in the run's log while the session still runs, counts to 4 and asks for the next session
# (exit 85 with its checkpoint written).
LIVE = """
import os, sys, time
ck = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "step")
start = int(open(ck).read()) if os.path.exists(ck) else 0
print("resuming at", start, flush=True)
if start == 0:
    print("first line", flush=True)
    for _ in range(150):
        if os.path.exists(os.environ["LIVE_FLAG"]):
            break
        time.sleep(0.1)
for step in range(start + 1, 17):
    time.sleep(0.1)
    open(ck + ".new", "w").write(str(step))   # then renamed: a kill at any moment leaves a whole checkpoint
    os.replace(ck + ".new", ck)
    print("step", step, flush=True)
    if step == 4 and start == 0:
        sys.exit(85)
print("done", flush=True)
"""


def _watch_live(kaggle, flag, seen, stop):
    """Sets seen[0] once "first line" is in the run's log while Kaggle still runs session 1; then lets the job on."""
    logs = Path(os.environ["TPUCTL_HOME"])
    while not stop.is_set():
        first = [k for slug, k in list(kaggle.kernels.items()) if slug.endswith("-s1")]
        text = "".join(p.read_text() for p in logs.rglob("*.log") if "logs" in p.parts)
        if first and "first line" in text:
            seen[0] = first[0]["versions"][-1]["status"] == "RUNNING"
            flag.write_text("")
            return
        time.sleep(0.05)


@pytest.mark.parametrize("missing,ref", [(403, "code"), (404, "plain")])
def test_the_issue_check_a_token_a_throttled_api_a_chain_shown_live_and_nothing_left(kaggle, cli, tmp_path,
                                                                                      monkeypatch, missing, ref):
    """Issue 29's check: only KAGGLE_API_TOKEN; Kaggle names kernels after their titles, processes datasets after
    accepting them, answers `missing` for what is not there, throttles (429 with Retry-After) and drops connections;
    a job chained over sessions shows its first session's lines while that session runs, its checkpoint comes back
    through `download`, `jobs` shows it finished, and `down` leaves nothing (a kernel already deleted outside
    tpuctl included)."""
    from fakes.kaggle import TOKEN
    for var in ("KAGGLE_USERNAME", "KAGGLE_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("KAGGLE_API_TOKEN", TOKEN)
    kaggle.missing_status, kaggle.ref_style = missing, ref
    kaggle.throttle_every, kaggle.drop_every, kaggle.retry_after = 3, 7, "0.05"
    _up(cli, "--type", "v5e-8")
    monkeypatch.setenv("TPUCTL_KAGGLE_STREAM_RETRY", "0.05")
    flag = tmp_path / "flag"
    monkeypatch.setenv("LIVE_FLAG", str(flag))
    seen, stop = [False], threading.Event()
    watcher = threading.Thread(target=_watch_live, args=(kaggle, flag, seen, stop), daemon=True)
    watcher.start()
    code, out, err = cli("submit", str(make_job(tmp_path, LIVE)), "-c", "kg", "--chain", "30")
    stop.set()
    assert code == 0, out + err
    assert seen[0], "the first session's line reached the run's log only after the session ended\n" + out + err
    assert "Kaggle is processing it" in err and out.count("step 16\n") == 1 and "done\n" in out
    sessions = out.count("--- Kaggle session ")
    assert sessions >= 2 and out.count("resuming at") == sessions and out.count("first line") == 1
    assert all(slug.split("/")[1].startswith("tpuctl-") and slug.split("/")[1].endswith(f"-s{n}")
               for n, slug in enumerate(sorted(kaggle.kernels, key=lambda s: int(s.rsplit("s", 1)[1])), 1))
    assert kaggle.api_calls >= 3 * kaggle.throttle_every   # the API throttled and dropped calls all along
    assert (_downloaded(cli, tmp_path) / "step").read_text() == "16"
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "succeeded" and row["attempt"] == sessions
    assert kaggle.datasets == {}   # no unfinished run needs it and it was not to be kept: deleted at the run's end
    assert json.loads(cli("status", "-c", "kg", "--json")[1])["on_kaggle"].startswith("datasets: none; kernels: ")
    kaggle.kernels.pop(sorted(kaggle.kernels)[0])   # deleted by hand on kaggle.com: `down` finds it gone
    _down(cli, kaggle)


def test_logs_f_shows_a_running_sessions_lines(kaggle, cli, tmp_path, monkeypatch):
    _up(cli, "--type", "t4x2")
    monkeypatch.setenv("TPUCTL_KAGGLE_STREAM_RETRY", "0.05")
    flag = tmp_path / "flag"
    monkeypatch.setenv("LIVE_FLAG", str(flag))
    code, out, err = cli("submit", str(make_job(tmp_path, LIVE)), "-c", "kg", "--detach")
    assert code == 0, err
    seen, stop = [False], threading.Event()
    threading.Thread(target=_watch_live, args=(kaggle, flag, seen, stop), daemon=True).start()
    code, out, err = cli("logs", out.strip(), "-c", "kg", "-f")
    stop.set()
    assert code == 0 and seen[0] and out.count("first line") == 1 and "done\n" in out, out + err
    _down(cli, kaggle)


def test_a_follower_stopped_with_ctrl_c_lets_go_of_the_run_at_once(kaggle, cli, tmp_path, monkeypatch):
    """The lease a `logs -f` holds on the run it follows is given back when it stops, not left to lapse."""
    import signal
    import subprocess
    _up(cli, "--type", "t4x2")
    monkeypatch.setenv("LIVE_FLAG", str(tmp_path / "flag"))
    run_id = cli("submit", str(make_job(tmp_path, LIVE)), "-c", "kg", "--detach")[1].strip()
    follower = subprocess.Popen(tpuctl_at_a_terminal("logs", run_id, "-c", "kg", "-f"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    home = Path(os.environ["TPUCTL_HOME"])

    def holding():
        if follower.poll() is not None:
            raise AssertionError(f"the follower ended first ({follower.returncode}): {follower.stderr.read()!r}")
        return [p for p in home.rglob("remote.lease")
                if json.loads(p.read_text() or "{}").get("expires", 0) > time.time()]
    held = until(holding, 120, lambda: f"the follower's lease: {[p.read_text() for p in home.rglob('*.lease')]}")
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 130 and b"stopped following" in err, err
    assert json.loads(held[0].read_text())["expires"] == 0, held[0].read_text()   # given back, not left to lapse
    (tmp_path / "flag").write_text("")
    assert cli("logs", run_id, "-c", "kg", "-f")[0] == 0
    _down(cli, kaggle)


def test_the_quota_counts_running_sessions(kaggle, cli, tmp_path):
    """ApiAcceleratorQuota.time_reserved ("reserved by currently-running sessions") counts against what is left."""
    _up(cli, "--type", "v5e-8")
    job = make_job(tmp_path, "import time\ntime.sleep(60)\n", ON_TPU)
    code, out, err = cli("submit", str(job), "-c", "kg", "--detach")
    assert code == 0, err
    run_id = out.strip()
    time.sleep(2.5)
    kaggle.tpu_used = kaggle.tpu_allowed - 2
    quota = json.loads(cli("status", "-c", "kg", "--json")[1])["tpu_quota"]
    assert "reserved by running sessions" in quota and "guaranteed" in quota, quota
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg2", "--type", "v5e-8")
    assert code == 4 and "running sessions included" in err, err
    assert cli("cancel", run_id, "-c", "kg")[0] == 0
    _down(cli, kaggle)


def test_credentials_in_the_kaggle_clients_order(kaggle, cli, tmp_path, monkeypatch):
    """An API token (KAGGLE_API_TOKEN, as the token or a file; ~/.kaggle/access_token) before the legacy key, then
    `kaggle auth login`'s credentials.json; a token Kaggle says is not valid is one line, exit 5."""
    import datetime
    from fakes.kaggle import TOKEN
    home = tmp_path / "home-dir"
    (home / ".kaggle").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KAGGLE_KEY", "wrong")          # a legacy key that Kaggle refuses: never used below
    (home / ".kaggle" / "access_token").write_text(TOKEN + "\n")
    assert _up(cli, "--type", "cpu") is not None
    (home / ".kaggle" / "access_token").unlink()
    monkeypatch.setenv("KAGGLE_API_TOKEN", str(tmp_path / "token.txt"))
    (tmp_path / "token.txt").write_text(TOKEN)
    code, out, err = cli("submit", str(make_job(tmp_path, "print('hi')\n")), "-c", "kg")
    assert code == 0 and "hi" in out, err
    monkeypatch.setenv("KAGGLE_API_TOKEN", "KGAT_revoked")
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg")
    assert code == 5 and "not valid" in err and "KAGGLE_API_TOKEN" in err and "Traceback" not in err, err
    assert "KGAT_revoked" not in err
    for var in ("KAGGLE_API_TOKEN", "KAGGLE_USERNAME", "KAGGLE_KEY"):
        monkeypatch.delenv(var)
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg")
    assert code == 5 and "no Kaggle credentials" in err and "Generate New Token" in err
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    (home / ".kaggle" / "credentials.json").write_text(json.dumps({
        "refresh_token": "r", "access_token": TOKEN, "access_token_expiration": later.isoformat(),
        "username": "alice", "scopes": []}))   # as kagglesdk/kaggle_creds.py `save` writes it
    assert _up(cli, "--type", "cpu") is not None
    _down(cli, kaggle)


def test_429_waits_its_retry_after_and_gives_up_after_ten_attempts(kaggle):
    from email.utils import format_datetime
    from types import SimpleNamespace
    from tpuctl.core.errors import TpuctlError
    from tpuctl.providers.kaggle.client import Kaggle
    from tpuctl.providers.kaggle.retries import retry_after
    k = Kaggle()
    kaggle.throttle_every, kaggle.retry_after = 2, "0.4"
    kaggle.api_calls = 0
    t = time.monotonic()
    k.tpu_quota()
    k.tpu_quota()                                   # the second call is throttled once: waits 0.4 s, then answered
    assert time.monotonic() - t >= 0.4 and kaggle.api_calls == 3
    kaggle.throttle_every, kaggle.retry_after, kaggle.api_calls = 1, "0", 0
    with pytest.raises(TpuctlError) as e:
        k.tpu_quota()
    assert kaggle.api_calls == 10 and "429" in e.value.message
    soon = datetime_in(2.0)
    assert 1.0 < retry_after(SimpleNamespace(headers={"Retry-After": format_datetime(soon, usegmt=True)})) <= 2.0
    assert retry_after(SimpleNamespace(headers={})) is None


def test_a_lost_answer_to_a_push_or_a_dataset_is_looked_for_not_made_twice(kaggle, cli, tmp_path):
    """SaveKernel and CreateDataset done, their answers lost: retried blindly, a second session would run."""
    _up(cli, "--type", "cpu")
    kaggle.lose_answers = ["CreateDataset", "SaveKernel"]
    code, out, err = cli("submit", str(make_job(tmp_path, "print('once')\n")), "-c", "kg")
    assert code == 0 and out.count("once\n") == 1, out + err
    assert kaggle.lose_answers == [] and sum(c.endswith("/CreateDataset") for c in kaggle.calls) == 1
    assert [len(k["versions"]) for k in kaggle.kernels.values()] == [1]
    kaggle.drop_before = ["CreateDataset", "SaveKernel"]   # lost before Kaggle saw them: made, once
    code, out, err = cli("submit", str(make_job(tmp_path, "print('twice')\n", name="other")), "-c", "kg")
    assert code == 0 and out.count("twice\n") == 1, out + err
    assert kaggle.drop_before == [] and sum(c.endswith("/CreateDataset") for c in kaggle.calls) == 3
    assert sorted(len(k["versions"]) for k in kaggle.kernels.values()) == [1, 1]
    _down(cli, kaggle)


def test_a_run_whose_submit_never_reached_kaggle_ends_and_cancel_of_a_queued_one_works(kaggle, cli, tmp_path):
    """A submit killed between the run's job.json and its hand-over (or a run left so by an earlier tpuctl)."""
    from tpuctl.core import layout
    from tpuctl.providers.local import data_home
    _up(cli, "--type", "cpu")
    store = data_home() / "clusters" / "kg" / "store"
    ids = []
    for name in ("old", "new"):
        code, out, err = cli("submit", str(make_job(tmp_path, "print(1)\n", name=name)), "-c", "kg", "--detach")
        assert code == 0, err
        ids.append(out.strip())
        for key in (layout.run_remote(ids[-1]), layout.run_status(ids[-1], 0)):
            (store / key).unlink()
    job = store / layout.run_job(ids[0])
    job.write_text(json.dumps(dict(json.loads(job.read_text()), submitted=time.time() - 3600)))
    rows = {r["id"]: r for r in json.loads(cli("jobs", "-c", "kg", "--json")[1])}
    assert rows[ids[0]]["state"] == "failed" and "never reached Kaggle" in rows[ids[0]]["note"]
    assert rows[ids[1]]["state"] == "queued"           # its submit may still be handing it over
    assert cli("cancel", ids[1], "-c", "kg")[0] == 0
    assert json.loads(cli("jobs", "-c", "kg", "--json")[1])[0]["state"] == "cancelled"
    kaggle.kill_all()
    for slug in list(kaggle.kernels):                  # the sessions their records no longer name
        kaggle.kernels.pop(slug)
    _down(cli, kaggle)


def datetime_in(seconds):
    import datetime
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)


def test_a_dataset_kaggle_fails_to_process_is_made_again_and_a_push_before_ready_is_refused(kaggle, cli, tmp_path):
    from tpuctl.core.errors import TpuctlError
    from tpuctl.providers.kaggle.client import Kaggle
    _up(cli, "--type", "cpu")
    kaggle.fail_datasets = 1
    code, out, err = cli("submit", str(make_job(tmp_path, "print('made twice')\n")), "-c", "kg")
    assert code == 0 and "made twice" in out, err
    assert "failed to process it; deleting it and uploading it again" in err
    assert sum(c.endswith("/CreateDataset") for c in kaggle.calls) == 2 and kaggle.datasets == {}   # released
    k = Kaggle()
    kaggle.dataset_processing = 60
    k.create_dataset("tpuctl-not-ready", "tpuctl not ready", {"a.txt": b"a"})
    assert k.dataset_status("tpuctl-not-ready") == "NOT_YET_PERSISTED"
    with pytest.raises(TpuctlError) as e:
        k.push_kernel("tpuctl-early", "tpuctl early", "print(1)", "", ["tpuctl-not-ready"], [], False, 0)
    assert "not processed yet" in e.value.message
    k.delete_dataset("tpuctl-not-ready")
    _down(cli, kaggle)


def test_a_cluster_taken_down_mid_chain_ends_its_run_and_comes_back_with_up(kaggle, cli, tmp_path, monkeypatch):
    """Issue 28 item 4 and issue 29's new user: after `down` during a session, the run ends with a reason (no exit
    3 from `jobs`, its time stops), and `up -c kg` (the hint tpuctl prints) brings the cluster back."""
    _up(cli, "--type", "v5e-8")
    job = make_job(tmp_path, "import time\nprint('long', flush=True)\ntime.sleep(60)\n", ON_TPU)
    code, out, err = cli("submit", str(job), "-c", "kg", "--detach", "--chain", "3")
    assert code == 0, err
    run_id = out.strip()
    status = json.loads(cli("status", "-c", "kg", "--json")[1])
    assert status["on_kaggle"].startswith("datasets: alice/tpuctl-") and \
        status["on_kaggle"].endswith(f"; kernels: alice/tpuctl-{run_id}-s1"), status
    _down(cli, kaggle)
    durations = []
    for _ in range(2):
        code, out, err = cli("jobs", "-c", "kg", "--json")
        assert code == 0, err
        [row] = json.loads(out)
        assert row["state"] == "ended" and row["note"] == "ended: cluster taken down"
        durations.append(row["duration"])
        time.sleep(1.1)
    assert durations[0] == durations[1]   # its time stopped with it
    assert "ended: cluster taken down" in cli("logs", run_id, "-c", "kg")[1]
    code, out, err = cli("up", "-c", "kg")
    assert code == 0 and "not apply" not in err, err
    code, out, err = cli("up", "-c", "kg", "--provider", "kaggle", "--type", "v5e-8")
    assert code == 0, err
    code, out, err = cli("submit", str(make_job(tmp_path, "print('back')\n", ON_TPU, name="again")), "-c", "kg")
    assert code == 0 and "back" in out, err
    _down(cli, kaggle)


def test_a_submit_kaggle_refuses_fails_the_run_with_the_reason(kaggle, cli, tmp_path, monkeypatch):
    _up(cli, "--type", "cpu")
    monkeypatch.setenv("KAGGLE_KEY", "rejected")
    code, out, err = cli("submit", str(make_job(tmp_path, "print(1)\n")), "-c", "kg")
    assert code == 5 and "refused the credentials" in err and "Traceback" not in err
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "failed" and "refused the credentials" in row["note"]
    assert "refused the credentials" in cli("logs", row["id"], "-c", "kg")[1]
    code, out, err = cli("cancel", row["id"], "-c", "kg")
    assert code == 2 and "already failed" in err
    monkeypatch.setenv("KAGGLE_KEY", KEY)
    _down(cli, kaggle)


@pytest.mark.slow(50)
def test_a_run_longer_than_a_session_chains_through_sessions_and_down_leaves_nothing(kaggle, cli, tmp_path,
                                                                                      monkeypatch):
    err = _up(cli, "--type", "v5e-8")
    assert "TpuV5E8" in err and "free" in err
    status = json.loads(cli("status", "-c", "kg", "--json")[1])
    assert status["tpu_quota"].startswith("0s of 20h used this week") and status["machine_shape"] == "TpuV5E8"
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "1.2")   # the script stops the job, the next session goes on
    job = make_job(tmp_path, COUNTER, ON_TPU)
    code, out, err = cli("submit", str(job), "-c", "kg", "--chain", "30", "--keep-inputs")
    assert code == 0, out + err
    assert out.count("resuming at") >= 3 and "resuming at 0 on kaggle:TpuV5E8" in out
    assert out.count("step 16\n") == 1 and out.splitlines()[-2:][0] == "done"
    assert out.splitlines()[-1].startswith("--- Kaggle session ") and "COMPLETE" in out.splitlines()[-1]
    assert "the next session resumes it" in out
    sessions = out.count("--- Kaggle session ")
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "succeeded" and row["attempt"] == sessions >= 3
    assert len(row["sessions"]) == sessions and all(s["state"] == "COMPLETE" and s["hours"] > 0
                                                    for s in row["sessions"])
    # what was pushed: the TPU's machine shape, private, no pinned image, the dataset (and the previous session)
    pushed = [json.loads(k["request"]) if isinstance(k["request"], str) else k["request"]
              for k in kaggle.kernels.values()]
    assert all(p["machineShape"] == "TpuV5E8" and p["isPrivate"] and "dockerImage" not in p for p in pushed)
    assert sorted(len(p.get("kernelDataSources", [])) for p in pushed) == [0] + [1] * (sessions - 1)
    assert len(kaggle.datasets) == 1 and all(d["private"] for d in kaggle.datasets.values())
    assert (_downloaded(cli, tmp_path) / "step").read_text() == "16"
    # the same job again: its dataset is there already, nothing is uploaded
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "60")
    uploads = sum(1 for c in kaggle.calls if c.startswith("PUT /upload/"))
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 0 and "unchanged: nothing uploaded" in err, err
    assert sum(1 for c in kaggle.calls if c.startswith("PUT /upload/")) == uploads and len(kaggle.datasets) == 1
    _down(cli, kaggle)


@pytest.mark.slow(40)
def test_a_detached_chain_is_moved_on_by_tpuctl_watch(kaggle, cli, tmp_path, monkeypatch):
    _up(cli, "--type", "v5e-8")
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "1.2")
    code, out, err = cli("submit", str(make_job(tmp_path, COUNTER, ON_TPU)), "-c", "kg", "--detach", "--chain", "30")
    assert code == 0, err
    code, _, err = cli("watch", "-c", "kg")          # nobody follows it: the watch pushes each next session
    assert code == 0 and "no unfinished run" in err, err
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "succeeded" and row["attempt"] >= 3
    assert "step 16" in cli("logs", "-c", "kg")[1]
    _down(cli, kaggle)


@pytest.mark.slow(45)
def test_a_watch_and_a_follower_of_one_chain_push_each_session_once_and_write_each_line_once(kaggle, cli, tmp_path,
                                                                                             monkeypatch):
    """`tpuctl watch` and `tpuctl logs -f` of the same run (two processes, as a user leaves them): one moves it on at
    a time (a lease on the run), so no next session is pushed twice and no log line is lost or written twice."""
    import subprocess
    import sys
    _up(cli, "--type", "v5e-8")
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "1.2")
    code, out, err = cli("submit", str(make_job(tmp_path, COUNTER, ON_TPU)), "-c", "kg", "--detach", "--chain", "30")
    assert code == 0, err
    kaggle.latency = 0.1
    follower = subprocess.Popen([sys.executable, "-m", "tpuctl", "logs", "-c", "kg", "-f"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    code, _, err = cli("watch", "-c", "kg")
    assert code == 0 and "no unfinished run" in err, err
    followed, said = follower.communicate(timeout=120)
    assert follower.returncode == 0, said
    assert all(len(k["versions"]) == 1 for k in kaggle.kernels.values()), \
        {slug: len(k["versions"]) for slug, k in kaggle.kernels.items()}   # each session pushed once
    log = cli("logs", "-c", "kg")[1]
    for text in (log, followed.decode()):
        assert [text.count(f"step {i}\n") for i in range(1, 17)] == [1] * 16, text
        assert text.count("--- Kaggle session ") == len(kaggle.kernels) >= 3, text
    _down(cli, kaggle)


def test_a_session_kaggle_stops_at_its_hard_limit_is_continued(kaggle, cli, tmp_path, monkeypatch):
    """The job ignores the deadline and the script's own stop comes too late: Kaggle ends the session (ERROR, time
    limit); its output so far is attached to the next session, which resumes from the checkpoint."""
    _up(cli, "--type", "t4x2")   # no TensorFlow to install: the whole limit is the job's
    kaggle.session_limit = 1.5
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "60")
    code, out, err = cli("submit", str(make_job(tmp_path, COUNTER)), "-c", "kg", "--chain", "30")
    assert code == 0, out + err
    # a kill between the job's checkpoint and its print of it leaves "step 16" to the next session's "resuming at 16"
    assert "exceeded the session time limit" in out and "resuming at 0" in out and \
        ("step 16\n" in out or "resuming at 16" in out)
    assert out.count("resuming at") >= 2
    _down(cli, kaggle)


def test_a_session_stopped_at_its_limit_takes_the_job_with_it(kaggle, cli, tmp_path):
    """The fake's claim: Kaggle ending a session ends every process in it (a stopped container), so the job, which
    tpuctl starts in a session of its own and which here neither prints nor watches the deadline, is gone once
    the session reads ERROR; left running, it would write into the output the next session is given."""
    _up(cli, "--type", "t4x2")
    kaggle.session_limit = 1.5
    pids = tmp_path / "pids"
    job = make_job(tmp_path, f"import os, time\nopen({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
                             "while True:\n    time.sleep(0.1)\n")
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert "exceeded the session time limit" in out, out + err
    [pid] = [int(p) for p in pids.read_text().split()]
    state = Path(f"/proc/{pid}/stat")
    assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] in "ZX", "the job outlived its session"
    _down(cli, kaggle)


def test_a_job_that_fails_fails_the_run_with_its_code(kaggle, cli, tmp_path):
    _up(cli, "--type", "cpu")
    code, out, err = cli("submit", str(make_job(tmp_path, "print('about to fail')\nraise SystemExit(3)\n")), "-c", "kg")
    assert code == 3, out + err
    assert "about to fail" in out and "ERROR" in out
    assert [k["request"].get("machineShape") for k in kaggle.kernels.values()] == [None]
    _down(cli, kaggle)


def test_cancel_stops_the_session(kaggle, cli, tmp_path):
    _up(cli, "--type", "t4x2")
    job = make_job(tmp_path, "import time\nprint('long', flush=True)\ntime.sleep(60)\n")
    code, out, err = cli("submit", str(job), "-c", "kg", "--detach")
    assert code == 0, err
    run_id = out.strip()
    assert cli("cancel", run_id, "-c", "kg")[0] == 0
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "cancelled" and kaggle.kernels == {}
    _down(cli, kaggle)


def test_credentials_and_refusals_are_one_line_each_and_leave_nothing(kaggle, cli, tmp_path, monkeypatch):
    monkeypatch.delenv("KAGGLE_USERNAME")
    monkeypatch.delenv("KAGGLE_KEY")
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg")
    assert code == 5 and "no Kaggle credentials" in err and "kaggle.json" in err and "Traceback" not in err
    cfg = Path(os.environ["KAGGLE_CONFIG_DIR"])
    cfg.mkdir()
    (cfg / "kaggle.json").write_text(json.dumps({"username": "alice", "key": KEY}))
    (cfg / "kaggle.json").chmod(0o644)
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg")
    assert code == 5 and "readable by other users" in err and "chmod 600" in err
    (cfg / "kaggle.json").chmod(stat.S_IRUSR | stat.S_IWUSR)
    (cfg / "kaggle.json").write_text(json.dumps({"username": "alice", "key": "wrong"}))
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg")
    assert code == 5 and "refused the credentials" in err and "wrong" not in err
    (cfg / "kaggle.json").write_text(json.dumps({"username": "alice", "key": KEY}))
    kaggle.tpu_used = kaggle.tpu_allowed
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg", "--type", "v5e-8")
    assert code == 4 and "weekly TPU quota" in err
    code, out, err = cli("up", "--provider", "kaggle", "-c", "kg", "--type", "p100")
    assert code == 2 and "retired" in err and "t4x2" in err
    kaggle.tpu_used = 0.0
    _up(cli, "--type", "v5e-8")
    kaggle.phone_verified = False
    code, out, err = cli("submit", str(make_job(tmp_path, "print(1)\n")), "-c", "kg")
    assert code == 6 and "Phone verification" in err and "verify your phone" in err
    assert kaggle.kernels == {}
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])   # the run that Kaggle refused: failed, and why
    assert row["state"] == "failed"
    assert "Phone verification" in cli("logs", row["id"], "-c", "kg")[1]
    _down(cli, kaggle)


# A session's state asked every 0.5 s, not the fixture's 0.05 s, in the tests whose sessions train for tens of
# seconds: each ask is an API call and two store writes (the record and status.json's heartbeat), 20 a second
# cost several CPU-seconds a test; the job's lines come by the session's stream, whatever the poll.
BERT_POLL = "0.5"


def _final(out):
    """(step, loss) of the last `step N loss L` line."""
    last = [line.split() for line in out.splitlines() if line.startswith("step ") and " loss " in line][-1]
    return int(last[1]), float(last[3])


@pytest.mark.slow(70)
def test_bert_cut_by_the_session_limit_ends_as_the_uninterrupted_run(kaggle, cli, monkeypatch, tmp_path):
    """The flagship job on Kaggle: sessions cut at their limit (the job saves and exits 85 when
    tpuctl.runtime.session_ending() says so, at a log line), chained into one run, end at the step and loss of an
    uninterrupted run on the same prepared data (prepared once, in the run's store, kept across its sessions: the
    tokenizer's training is not reproducible to the bit, so a second preparation would differ)."""
    import shutil
    import subprocess
    import sys
    _up(cli, "--type", "t4x2")   # Kaggle's GPU image has its TensorFlow (here this environment's, on the CPU)
    # The job forced onto the TensorFlow backend (its own tpuctl.toml key; tpuctl's pick on a GPU is JAX) so that the
    # uninterrupted reference below runs the same backend: the two must agree to the last digit. The JAX path on
    # Kaggle has its own test (test_the_bert_job_runs_on_the_images_jax_with_nothing_installed).
    job = shutil.copytree(JOB, tmp_path / "bert_pretrain", ignore=shutil.ignore_patterns("__pycache__"))
    toml = (job / "tpuctl.toml").read_text()
    (job / "tpuctl.toml").write_text(toml.replace("\n[env]", '\nkeras_backend = "tensorflow"\n\n[env]', 1))
    # two steps on each side of the session's cut, at batch 4 (a resume is proven so; test_bert's SIGKILL resume
    # is as small), on a 0.6 MB generated corpus with a 3,000-word vocabulary (run.py's flags: 2 MB, 8,000 by default)
    steps = ["--preset", "tiny", "--steps", "4", "--batch-size", "4", "--deterministic", "--log-every", "2",
             "--checkpoint-every", "2", "--seq-length", "64", "--max-predictions-per-seq", "10"]
    corpus = ["--sample-mb", "0.6", "--vocab-size", "3000"]
    # Each session's deadline has passed by the time its job trains (1 s), so the job ends its session at its first
    # log line, step 2 then step 4 (the last: it just ends): two sessions on any machine, however fast or loaded.
    # The grace, in which a job that watches the deadline saves and stops itself, bounds nothing here but a hang.
    monkeypatch.setenv("TPUCTL_KAGGLE_SESSION_SECONDS", "1")
    monkeypatch.setenv("TPUCTL_KAGGLE_GRACE_SECONDS", "500")
    monkeypatch.setenv("TPUCTL_KAGGLE_POLL", BERT_POLL)
    code, cut, err = cli("submit", str(job), "-c", "kg", "--chain", "4", "--", *corpus, *steps)
    assert code == 0, cut[-3000:] + err[-2000:]
    sessions = cut.count("--- Kaggle session ")
    assert sessions == 2 and "bert: the session ends: checkpoint at step 2," in cut, cut[-3000:]
    assert "bert: resumed from step 2" in cut
    assert cut.count("generated 0.6 MB") == 1 or "prepared" in cut   # prepared once for all sessions
    [k] = [k for slug, k in kaggle.kernels.items() if slug.endswith(f"-s{sessions}")]
    prepared = k["versions"][-1]["dir"] / "kaggle" / "working" / "store" / "prepared" / "bert_pretrain-64"
    vocab = json.loads((prepared / "prepared.json").read_text())["vocab_size"]
    whole = subprocess.run([sys.executable, str(JOB / "train.py"), "--data", f"{prepared}/part-*.tfrecord",
                            "--vocab-size", str(vocab), "--output", str(tmp_path / "whole"), *steps], capture_output=True, text=True,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow"), timeout=600)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert _final(cut) == _final(whole.stdout) and _final(cut)[0] == 4
    assert list((_downloaded(cli, tmp_path) / "checkpoints").glob("ckpt-4.weights.h5"))
    _down(cli, kaggle)


# -- inside the session (issue 29 items 2, 3, 8; issue 28 item 7) ------------------------------------------------------

MARKERS = "@OUTPUT@ @EXIT@ @CONTINUE@ @CONTINUE_MARK@ @STORE@"


def test_template_markers_in_a_jobs_command_args_and_env_reach_it_as_written(kaggle, cli, tmp_path):
    _up(cli, "--type", "cpu")
    job = make_job(tmp_path, "import os, sys\nprint('env', os.environ['MARKS'], 'args', *sys.argv[1:])\n",
                   f'[env]\nMARKS = "{MARKERS}"\n')
    (job / "tpuctl.toml").write_text((job / "tpuctl.toml").read_text().replace(
        'command = "python main.py"', f'command = "echo cmd {MARKERS} && python main.py"'))
    code, out, err = cli("submit", str(job), "-c", "kg", "--", *MARKERS.split())
    assert code == 0, out + err
    assert f"cmd {MARKERS}\n" in out and f"env {MARKERS} args {MARKERS}\n" in out, out


TWO_SESSIONS = """
import os, sys
print("data:", open(os.path.join(os.environ["TPUCTL_DATA_DIR"], "d", "greeting.txt")).read().strip(), flush=True)
ck = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "ck.tar.gz")   # an archive in the output: copied back as it is
if os.environ["TPUCTL_SESSION"] == "1":
    open(ck, "wb").write(b"\\x1f\\x8b checkpoint")
    sys.exit(85)                                  # checkpoint written: go on in the next session
print("resumed from", open(ck, "rb").read()[2:].decode().strip(), flush=True)
"""


@pytest.mark.parametrize("layout", ["datasets", "flat"])
@pytest.mark.parametrize("unpack", [True, False], ids=["archives-unpacked", "archives-kept"])
def test_the_session_finds_its_inputs_wherever_kaggle_mounts_them(kaggle, cli, tmp_path, layout, unpack):
    """Both mount layouts (datasets/<owner>/<slug> and the older <slug>), archives unpacked or kept: the inputs and
    the previous session's output are found by their markers and checked against the manifest."""
    _up(cli, "--type", "cpu")
    kaggle.mount_layout, kaggle.unpack_archives = layout, unpack
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "greeting.txt").write_text("hello\n")
    code, out, err = cli("submit", str(make_job(tmp_path, TWO_SESSIONS)), "-c", "kg", "--data", str(tmp_path / "d"),
                         "--chain", "3")
    assert code == 0, out + err
    assert out.count("data: hello") == 2 and "resumed from checkpoint" in out
    assert out.count("sizes and sha256 as uploaded") == 2
    mounted = [p for k in kaggle.kernels.values() for s in k["versions"] for p in s["dir"].rglob("tpuctl-inputs-*")]
    assert len(mounted) == 2 and all(("/input/datasets/alice/" in str(p)) == (layout == "datasets") for p in mounted)
    _down(cli, kaggle)


def test_inputs_that_are_not_there_or_not_as_uploaded_are_named(kaggle, cli, tmp_path):
    _up(cli, "--type", "cpu")
    job = make_job(tmp_path, "print('the job ran')\n")
    assert cli("submit", str(job), "-c", "kg", "--keep-inputs")[0] == 0   # kept, to be damaged below
    [ds] = kaggle.datasets.values()
    ds["files"]["data.tar.bin"] += b"damaged"          # the same job again attaches the same dataset, now damaged
    code, out, err = cli("submit", str(job), "-c", "kg", "--keep-inputs")
    assert code == 127 and "the job ran" not in out, out
    assert "are not what was uploaded: data.tar.bin has" in out, out
    ds["files"]["data.tar.bin"] = ds["files"]["job.tar.gz.bin"][len(b"tpuctl payload 1\n"):]   # a real archive
    code, out, err = cli("submit", str(job), "-c", "kg", "--keep-inputs")
    assert code == 127 and "data.tar.bin arrived as a folder (Kaggle unpacked it)" in out, out
    del ds["files"]["data.tar.bin"]
    code, out, err = cli("submit", str(job), "-c", "kg", "--keep-inputs")
    assert code == 127 and "data.tar.bin is missing" in out, out
    [manifest] = [n for n in ds["files"] if n.startswith("tpuctl-inputs-")]
    del ds["files"][manifest]
    code, out, err = cli("submit", str(job), "-c", "kg", "--keep-inputs")
    assert code == 127 and f"cannot find the run's inputs (marker {manifest})" in out, out
    assert "there: datasets/alice/tpuctl-" in out, out
    _down(cli, kaggle)


PRINT_TF = """import importlib.metadata as m, tensorflow as tf
print("version", tf.__version__, "from", tf.__distribution__)
print("distributions", sorted(set(m.packages_distributions().get("tensorflow", []))))
print("keras", tf.keras.__name__, tf.keras.__version__)
print("tpu cores", len(tf.config.list_logical_devices("TPU")))
"""
NOISE = ("E0000 00:00:1732000000.123456    4242 cuda_executor.cc:1228] failed call to cuInit: INTERNAL: CUDA error: "
         "Failed call to cuInit: UNKNOWN ERROR (303)")


def test_a_tensorflow_job_on_the_tpu_gets_a_tensorflow_that_drives_it(kaggle, cli, tmp_path):
    """Kaggle's TPU image has tensorflow-cpu only: the session installs tensorflow-tpu at the job's version with
    tf-keras, keeps the job's requirements from replacing it, and checks the TPU before the job starts. The image's
    own libtpu 0.0.17 satisfies tensorflow-tpu's libtpu~=0.0.14, so pip installs none into the session's
    environment: TensorFlow is pointed at the image's (issue 36: before, at a path that did not exist, exit 127)."""
    _up(cli, "--type", "v5e-8")
    job = make_job(tmp_path, f"print({NOISE!r}, flush=True)\n" + PRINT_TF,
                   'tensorflow = "2.19"\nrequirements = "requirements.txt"\n')
    (job / "requirements.txt").write_text("tf-keras\n")   # as the BERT job's: would pull PyPI's tensorflow
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 0, out + err
    assert "version 2.19.1 from tensorflow-tpu" in out, out
    # no PyPI tensorflow in the job's environment; the image's tensorflow-cpu is there, behind tensorflow-tpu
    assert "distributions ['tensorflow-cpu', 'tensorflow-tpu']" in out, out
    assert "keras tf_keras 2.19.0" in out and "tpu cores 8" in out
    assert "TensorFlow 2.19.1 sees 8 TPU core(s)" in out
    image_libtpu = r"\S*/tpu-image/lib/python[0-9.]+/site-packages/libtpu/libtpu\.so"
    assert re.search(r"tpuctl: TensorFlow's TPU library: " + image_libtpu, out), out
    assert "cuInit" not in out                             # TensorFlow's start-up noise, filtered as the agent does
    # a TensorFlow that cannot drive the TPU (here: no PJRT library path): one line, and the job never starts
    (job / "tpuctl.toml").write_text((job / "tpuctl.toml").read_text() + '[env]\nTF_PLUGGABLE_DEVICE_LIBRARY_PATH = ""\n')
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 127 and "version 2.19.1" not in out, out
    assert "TensorFlow 2.19.1 from " in out and "sees no TPU, only CPU; RuntimeError: No TPU platform found" in out
    assert 'JAX drives this TPU: run the job as Keras 3 (framework = "keras" in tpuctl.toml)' in out, out
    _down(cli, kaggle)


@pytest.mark.slow(40)
def test_a_keras_job_runs_on_the_images_jax_with_nothing_installed(kaggle, cli, tmp_path, jax_python, capsys):
    """Issue 36: a Keras 3 job on Kaggle's TPU runs on the image's JAX (tpu/requirements.in: jax[tpu], keras>3), the
    backend said among the log's first lines; the session installs nothing (no requirements, no TensorFlow)."""
    kaggle.tpu_jax_site = next(jax_python.parent.parent.glob("lib/python*/site-packages"))
    _up(cli, "--type", "v5e-8")
    code, out, err = cli("submit", str(KERAS_JOB), "-c", "kg")
    assert code == 0, out + err
    first = out.splitlines()[:4]
    assert any(line.startswith("tpuctl: keras backend jax (Kaggle's TPU image drives the TPU with JAX") for line in first), out
    assert "backend jax KERAS_BACKEND jax" in out and "loss fell" in out, out
    assert "install" not in out and "TensorFlow" not in out.replace("has no TPU TensorFlow", ""), out
    [session] = [s for k in kaggle.kernels.values() for s in k["versions"]]
    assert not (session["dir"] / "kaggle" / "temp" / "tpuctl" / "envs").exists()   # no environment was made
    first_step = float(re.search(r"first step at ([0-9.]+)", out).group(1))
    with capsys.disabled():   # the figure issue 36 asks for, as the fake can measure it (pytest -s shows it)
        print(f"\nsession start to first step: {first_step - session['started_at']:.1f} s (fake Kaggle, this CPU)")
    _down(cli, kaggle)


@pytest.mark.skipif("tf-keras" in (JOB / "requirements.txt").read_text(),
                    reason="needs i36-job's Keras 3 jobs/bert_pretrain")
@pytest.mark.slow(30)
def test_the_bert_job_runs_on_the_images_jax_with_nothing_installed(kaggle, cli, tmp_path, jax_python, monkeypatch):
    """The job as submitted (run.py: a generated corpus, its preparation, train.py) on the image's JAX, installing
    nothing; small, as test_keras_backends' run without TensorFlow (a 0.3 MB corpus, 2,000 words, sequences of 64,
    two steps of 4: run.py's 2 MB, 8,000 words, 128 and train.py's 32 a step prove no more of what is installed)."""
    kaggle.tpu_jax_site = next(jax_python.parent.parent.glob("lib/python*/site-packages"))
    monkeypatch.setenv("TPUCTL_KAGGLE_POLL", BERT_POLL)
    _up(cli, "--type", "v5e-8")
    code, out, err = cli("submit", str(JOB), "-c", "kg", "--", "--preset", "tiny", "--sample-mb", "0.3",
                         "--vocab-size", "2000", "--seq-length", "64", "--max-predictions-per-seq", "10",
                         "--batch-size", "4", "--steps", "2", "--log-every", "2")
    assert code == 0, out + err
    assert "tpuctl: keras backend jax" in out and "installing" not in out, out
    assert "backend: jax" in out and [ln.split()[1] for ln in out.splitlines() if ln.startswith("step ")] == ["2"], out
    _down(cli, kaggle)


def test_a_jax_job_uses_the_images_own_stack(kaggle, cli, tmp_path):
    _up(cli, "--type", "v5e-8")
    job = make_job(tmp_path, "import importlib.util as u\nprint('tf-keras', u.find_spec('tf_keras') is not None)\n",
                   'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "kg")
    assert code == 0 and "tf-keras False" in out and "installing tensorflow" not in out, out
    _down(cli, kaggle)


def test_the_session_script_and_the_uploader_agree_on_the_payload_mark():
    from tpuctl.host import session
    from tpuctl.providers.kaggle import kernel
    assert kernel.MAGIC == session.MAGIC


def test_a_chain_keeps_the_script_that_matches_its_datasets_wheel(kaggle, cli, tmp_path, monkeypatch):
    """tpuctl upgraded while a chain runs: the next session still runs the script of the tpuctl whose wheel is in
    the run's dataset (a newer script beside an older wheel would call what that wheel does not have)."""
    _up(cli, "--type", "cpu")
    code, out, err = cli("submit", str(make_job(tmp_path, TWO_SESSIONS)), "-c", "kg", "--detach", "--chain", "3",
                         "--data", str(_greeting(tmp_path)))
    assert code == 0, err
    from tpuctl.providers.kaggle import kernel
    monkeypatch.setattr(kernel, "source", lambda: "raise SystemExit('a newer tpuctl, another wheel')\n")
    assert cli("watch", "-c", "kg")[0] == 0
    log = cli("logs", "-c", "kg")[1]
    assert "resumed from checkpoint" in log and "a newer tpuctl" not in log, log
    _down(cli, kaggle)


def _greeting(tmp_path):
    (tmp_path / "d").mkdir(exist_ok=True)
    (tmp_path / "d" / "greeting.txt").write_text("hello\n")
    return tmp_path / "d"


def test_a_previous_session_whose_output_is_not_attached_is_named(kaggle, cli, tmp_path):
    _up(cli, "--type", "cpu")
    code, out, err = cli("submit", str(make_job(tmp_path, TWO_SESSIONS)), "-c", "kg", "--detach", "--chain", "3",
                         "--data", str(_greeting(tmp_path)))
    assert code == 0, err
    [first] = [k["versions"][-1] for k in kaggle.kernels.values()]
    until(lambda: first["status"] != "RUNNING", 60, "the first session's end")
    [marker] = (first["dir"] / "kaggle" / "working").glob("tpuctl-*-s1.json")
    marker.unlink()                                      # its output, as the next session gets it, lacks the marker
    assert cli("watch", "-c", "kg")[0] == 0
    log = cli("logs", "-c", "kg")[1]
    assert f"cannot find the previous session's output (marker {marker.name})" in log, log
    assert "resumed from" not in log
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "failed" and row["exit_code"] == 127
    _down(cli, kaggle)


# -- what no source settles, answered each way by the fake (issue 39 item 5) --------------------------------------

# Two sessions: the first counts to 2 and asks for the next (exit 85 with its checkpoint); the second counts to 4.
TWO = """
import os, sys
ck = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "step")
start = int(open(ck).read()) if os.path.exists(ck) else 0
print("resuming at", start, flush=True)
for step in range(start + 1, 5):
    open(ck, "w").write(str(step))
    print("step", step, flush=True)
    if step == 2 and start == 0:
        sys.exit(85)
print("done", flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.6], ids=["at-once", "after-a-while"])
def test_the_next_sessions_input_refused_at_first_is_tried_again(kaggle, cli, tmp_path, delay):
    """Whether a just-finished session's output can be attached to the next kernel at once is not established: the
    push is tried again with backoff while Kaggle refuses it (fakes/kaggle.py `output_attach_delay`)."""
    _up(cli, "--type", "t4x2")
    kaggle.output_attach_delay = delay
    code, out, err = cli("submit", str(make_job(tmp_path, TWO)), "-c", "kg", "--chain", "3")
    assert code == 0, out + err
    assert "resuming at 2" in out and "done" in out
    saves = sum(1 for c in kaggle.calls if c.endswith("/SaveKernel"))
    assert (saves > 2) is (delay > 0), kaggle.calls       # refused pushes were tried again, and only then
    _down(cli, kaggle)


def test_the_next_sessions_input_never_attachable_ends_the_run_with_the_reason(kaggle, cli, tmp_path, monkeypatch):
    _up(cli, "--type", "t4x2")
    kaggle.output_attach_delay = float("inf")
    monkeypatch.setenv("TPUCTL_KAGGLE_INPUT_WAIT", "0.5")
    code, out, err = cli("submit", str(make_job(tmp_path, TWO)), "-c", "kg", "--chain", "3")
    assert code != 0
    assert "Kaggle cannot attach the previous session" in out + err and "still after" in out + err, out + err
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "failed"
    _down(cli, kaggle)


@pytest.mark.parametrize("deleted", ["free", "taken", "DELETED"])
def test_a_dataset_slug_a_deleted_dataset_still_holds_gets_a_fresh_one_at_once(kaggle, cli, tmp_path, monkeypatch,
                                                                              deleted):
    """The run's dataset is deleted when the run ends; the same work submitted again makes the same slug and title.
    Whether Kaggle frees them is not established (fakes/kaggle.py `deleted_slugs`): a held one is replaced at once,
    never waited for (TPUCTL_KAGGLE_DATASET_WAIT would fail the run)."""
    _up(cli, "--type", "t4x2")
    kaggle.deleted_slugs = deleted
    monkeypatch.setenv("TPUCTL_KAGGLE_DATASET_WAIT", "5")
    job = make_job(tmp_path, TWO)
    for _ in range(2):
        code, out, err = cli("submit", str(job), "-c", "kg", "--chain", "3")
        assert code == 0, out + err
        assert kaggle.datasets == {}                        # released when the run ended
    assert ("Kaggle still holds the name of a deleted one" in err) is (deleted != "free"), err
    _down(cli, kaggle)


def test_output_names_that_would_leave_the_output_directory_are_refused_with_the_name(tmp_path):
    """Kaggle lists a session's output files by the names the job gave them; nothing says they are checked."""
    from tpuctl.providers.kaggle import kernel, outputs
    out = tmp_path / "output"
    out.mkdir()
    names = [f"{kernel.OUTPUT}/../../evil", f"{kernel.OUTPUT}//etc/passwd", f"{kernel.OUTPUT}/a/../../x"]
    refused = []
    marks, code, progressed = outputs.fetch_output([(n, "http://127.0.0.1:9/never") for n in names], out,
                                                   refused.append)
    assert len(refused) == 3 and all(repr(n) in r for n, r in zip(names, refused)), refused
    assert not progressed and list(tmp_path.iterdir()) == [out] and list(out.iterdir()) == []


def test_the_kaggle_extras_python_floor_is_said_in_one_line():
    """kaggle 2.2.5 requires Python >= 3.11 (issue 39 item 6): the extra installs nothing on 3.10 (a marker, not a
    resolver error), and `--provider kaggle` there says what is missing in one line."""
    import tomllib
    from tpuctl.providers.kaggle.client import missing_client
    extra = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["kaggle"]
    assert extra == ["kaggle>=2.2.5,<3; python_version >= '3.11'"]
    e = missing_client((3, 10))
    assert e.exit_code == 2 and "needs Python 3.11 or newer" in e.message and "this is Python 3.10" in e.message
    assert "\n" not in e.message + e.hint
    assert "not installed" in missing_client((3, 12)).message


@pytest.mark.parametrize("stops", [True, False], ids=["delete-stops-it", "runs-on"])
def test_cancel_says_whether_kaggle_still_counts_the_session(kaggle, cli, tmp_path, stops):
    """Whether DeleteKernel stops a running session and its quota clock is not established (fakes/kaggle.py
    `delete_stops_session`): cancel deletes the kernel, then reads the quota's time_reserved and says what it found."""
    _up(cli, "--type", "v5e-8")
    kaggle.delete_stops_session = stops
    job = make_job(tmp_path, "import time\ntime.sleep(60)\n", ON_TPU)
    code, out, err = cli("submit", str(job), "-c", "kg", "--detach")
    assert code == 0, err
    run_id = out.strip()
    until(lambda: any(s["status"] == "RUNNING" and time.monotonic() - s["started"] > 1.5
                      for k in kaggle.kernels.values() for s in k["versions"]), 60, "the session to run")
    assert cli("cancel", run_id, "-c", "kg")[0] == 0
    log = cli("logs", run_id, "-c", "kg")[1]
    assert ("counts no running session now" in log) is stops, log
    assert ("may still be counted" in log) is not stops, log
    [row] = json.loads(cli("jobs", "-c", "kg", "--json")[1])
    assert row["state"] == "cancelled" and kaggle.kernels == {}
    _down(cli, kaggle)


@pytest.mark.parametrize("resumable", [True, False], ids=["resumed", "started-over"])
def test_an_upload_cut_mid_file_is_resumed_or_retried_by_file(kaggle, cli, tmp_path, monkeypatch, resumable):
    """Each input file is its own upload: one cut mid-file is resumed where it stopped (Google's resumable upload
    protocol, as the kaggle client speaks it) or, where the URL kept nothing, sent again: that file alone, and the
    session finds every input as uploaded (its sizes and sha256)."""
    monkeypatch.setenv("TPUCTL_RETRY_BASE", "0.01")
    _up(cli, "--type", "t4x2")
    kaggle.cut_uploads, kaggle.resumable_uploads = 2, resumable
    job = make_job(tmp_path, TWO)
    (job / "data").mkdir()
    (job / "data" / "big.bin").write_bytes(os.urandom(300_000))
    code, out, err = cli("submit", str(job), "-c", "kg", "--chain", "3", "--data", str(job / "data"))
    assert code == 0, out + err
    assert kaggle.cut_uploads == 0 and "sizes and sha256 as uploaded" in out, out
    starts = sum(1 for c in kaggle.calls if c.endswith("/StartBlobUpload"))          # one per file, none again
    puts = sum(1 for c in kaggle.calls if c.startswith("PUT /upload/"))
    assert puts == starts + 2 * 2, kaggle.calls   # each cut file: its cut PUT, the question, the rest (or all of it)
    _down(cli, kaggle)
