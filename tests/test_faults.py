"""Faults a job brings to its host, on the local provider through the real CLI: commands as a shell writes them,
and a job that leaves processes behind holding its output."""
import os
import stat
from pathlib import Path
import time

import pytest

from conftest import kill_dead, until
from jobs import make_job, tpuctl_within
from tpuctl.core import layout, runs, state
from tpuctl.providers.local import LocalProvider


@pytest.fixture
def quick_local(local_up, monkeypatch):
    """A local cluster whose agent drains a finished job's output for 1 s (TPUCTL_DRAIN_SECONDS), once the agent's
    own first writes (its heartbeat, the run index it ensures) have landed: after them, whatever appears in the
    store is the test's doing (under load they once landed inside a test's "nothing was written" window)."""
    monkeypatch.setenv("TPUCTL_DRAIN_SECONDS", "1")
    st = local_up("faults")
    store = Path(st.spec.store)
    until(lambda: (store / layout.RUN_INDEX_COMPLETE).exists() and list(store.glob(layout.AGENTS_PREFIX + "*")),
          what="the local agent's first tick")
    return st


def test_command_runs_as_a_shell_writes_it(quick_local, cli, tmp_path):
    job = make_job(tmp_path, "import os, sys\nprint('main', os.environ.get('FOO'), sys.argv[1:])\n",
                   name="shelljob")
    (job / "sub").mkdir()
    (job / "sub" / "b.py").write_text("import sys\nprint('b in sub', sys.argv[1:])\n")
    (job / "tpuctl.toml").write_text('command = "python main.py first && cd sub && FOO=1 python b.py"\n')
    code, out, err = cli("submit", str(job), "-c", "faults", "--", "--steps", "it's 5")
    assert code == 0, err
    assert out == "main None ['first']\nb in sub ['--steps', \"it's 5\"]\n"
    (job / "tpuctl.toml").write_text('command = "python main.py && exit 3 && python sub/b.py"\n')
    code, out, err = cli("submit", str(job), "-c", "faults")
    assert code == 3 and out == "main None []\n"        # the whole line ran, and its status is the run's


@pytest.mark.parametrize("leave_behind", [
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)",  # setsid
    "subprocess.Popen('sleep 300 &', shell=True)",                                                     # bash &
    "subprocess.Popen(['nohup', 'sleep', '300'])",                                                      # nohup
])
def test_a_job_that_leaves_processes_holding_its_output_ends(quick_local, cli, tmp_path, leave_behind):
    job = make_job(tmp_path, f"import subprocess, sys\n{leave_behind}\nprint('main done', flush=True)\n")
    code, out, err = cli("submit", str(job), "-c", "faults", "--detach")
    run_id = out.strip()
    store = LocalProvider().store(quick_local)
    until(lambda: runs.status(store, run_id).state.final, 30, "the run's end")   # the main process's end ends it
    assert runs.status(store, run_id).state is runs.RunState.SUCCEEDED
    code, out, err = cli("logs", run_id, "-c", "faults")
    assert out.startswith("main done\n") and "left running still held its output after 1s and were ended" in out
    pids = [int(p) for p in out.rsplit("(pids ", 1)[1].split(")")[0].split(", ")]
    for pid in pids:                                     # and they are gone, not orphaned
        deadline = time.time() + 5
        while time.time() < deadline and os.path.exists(f"/proc/{pid}") and \
                open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX":
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
    nxt = make_job(tmp_path, "print('next run')\n", name="next")
    code, out, err = cli("submit", str(nxt), "-c", "faults")   # the agent is free for the next run
    assert code == 0 and out == "next run\n"


@pytest.mark.parametrize("run_id,code,expect", [
    ("../../x", 2, "is not a run id"),
    ("2026-01-01", 2, "is not a run id"),
    ("20260101-000000-abc", 3, "no run id starts or ends with '20260101-000000-abc'"),   # a start, of no run
    ("20260101-000000-abcd", 3, "no run 20260101-000000-abcd"),
])
def test_cancel_of_a_bad_or_unknown_run_writes_nothing(quick_local, cli, run_id, code, expect):
    before = sorted(p for p in Path(quick_local.spec.store).rglob("*"))
    c, out, err = cli("cancel", run_id, "-c", "faults")
    assert c == code and expect in err
    assert sorted(Path(quick_local.spec.store).rglob("*")) == before
    assert not (Path(quick_local.spec.store).parent / "x").exists()


def test_a_run_cancelled_while_queued_never_starts(quick_local, cli, tmp_path):
    import signal
    os.kill(quick_local.host.pid, signal.SIGSTOP)          # the agent is busy elsewhere: the run stays queued
    try:
        job = make_job(tmp_path, "open('ran', 'w').write('yes')\nprint('ran')\n")
        code, out, err = cli("submit", str(job), "-c", "faults", "--detach")
        run_id = out.strip()
        assert cli("cancel", run_id, "-c", "faults")[0] == 0
    finally:
        os.kill(quick_local.host.pid, signal.SIGCONT)
    code, out, err = cli("logs", run_id, "-c", "faults", "-f")
    assert "cancelled" in err and out == ""
    assert not list(Path(quick_local.spec.store).parent.rglob("ran"))


def test_empty_cluster_name_and_type_spelling(env, cli):
    code, out, err = cli("status", "-c", "")
    assert code == 2 and "empty cluster name" in err
    for spelled in ("v3-08", "v3-0008"):
        code, out, err = cli("up", "--type", spelled, "--zone", "us-central1-b", "--project", "some-proj", "--dry-run")
        assert code == 2 and "leading zeros" in err and "--type v3-8" in err, err


@pytest.mark.parametrize("runtime, arch", [("../../x", "vm"), ("tpu-vm-tf-2.18.0/../x", "vm"), ("2.12.0", "vm"),
                                           ("TPU-VM-TF", "vm"), ("tpu-vm-tf-2.18.0-pjrt", "node"), ("", "vm")])
def test_a_runtime_google_would_never_name_is_refused_before_anything(env, cli, runtime, arch):
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "--project", "some-proj", "--arch", arch,
                         "--runtime", runtime, "--dry-run")
    if runtime == "":
        assert code == 0, err   # an empty --runtime is no --runtime
        return
    assert code == 2 and "--runtime" in err and "Traceback" not in err, err


def test_a_runtime_the_zone_does_not_offer_is_refused_before_the_bucket(cloud, cli, no_leak):
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "rt", "--runtime",
                         "tpu-vm-tf-9.9.9-pjrt")
    assert code == 2 and "not offered in us-central1-b" in err and "tpu-vm-tf-2.17.0-pjrt" in err, err
    assert not [c for c in cloud.gcs.calls if c.startswith("POST /storage/v1/b")]   # no bucket was made
    assert not [c for c in cloud.tpu.calls if "Create" in c[1]]


def test_a_corrupt_state_file_does_not_hide_the_other_clusters(quick_local, cli):
    from tpuctl.core import state
    bad = state.home() / "clusters" / "broken.json"
    bad.write_text('{"spec": {"name": "broken"')                 # truncated
    code, out, err = cli("ls", "--json")
    assert code == 0, err
    assert [r["cluster"] for r in __import__("json").loads(out)] == ["faults"]
    assert str(bad) in err and "delete" in err


def test_what_tpuctl_creates_is_private(quick_local, cli, tmp_path):
    from tpuctl.core import state
    home = state.home()
    assert (home / "clusters").stat().st_mode & 0o077 == 0
    assert (home / "clusters" / "faults.json").stat().st_mode & 0o077 == 0
    store = Path(quick_local.spec.store)
    assert store.stat().st_mode & 0o077 == 0
    job = make_job(tmp_path, "print('hi')\n", '[env]\nAPI_KEY = "secret"\n')
    assert cli("submit", str(job), "-c", "faults")[0] == 0
    for p in [*store.rglob("*"), *(store.parent / "work").rglob("*")]:
        try:
            mode = p.lstat().st_mode
        except FileNotFoundError:
            continue   # the agent took its queue entry between the listing and the look
        assert stat.S_ISLNK(mode) or mode & 0o077 == 0, p   # job.json holds API_KEY
    assert cli("status", "-c", "nope")[0] == 3
    code, out, err = cli("up", "--provider", "gcp", "--type", "v3-8", "--zone", "us-central1-b", "-c", "x",
                         "--project", "some-proj", "--yes")   # fails (no credentials): writes the debug log
    assert (home / "debug.log").stat().st_mode & 0o077 == 0


def test_a_second_up_or_down_waits_for_the_first_then_says_who_holds_it(quick_local, cli, monkeypatch):
    import threading
    from tpuctl.core.locks import cluster_lock
    monkeypatch.setenv("TPUCTL_LOCK_WAIT", "1")
    held, release = threading.Event(), threading.Event()

    def hold():
        with cluster_lock("faults", "up --type v3-8", lambda m: None):
            held.set()
            release.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    try:
        code, out, err = cli("down", "-c", "faults", "--yes")
        assert code == 2 and "waiting up to 1s" in err and "cluster faults is busy: `tpuctl up --type v3-8` (pid" in err
        assert LocalProvider().agent_alive(state.load("faults"))     # nothing was torn down
    finally:
        release.set()
        t.join(5)
    monkeypatch.setenv("TPUCTL_LOCK_WAIT", "10")
    held.clear()
    release.clear()
    t = threading.Thread(target=hold)
    t.start()
    held.wait(5)
    threading.Timer(0.5, release.set).start()
    code, out, err = cli("down", "-c", "faults", "--yes")       # waits for the holder, then goes ahead
    t.join(5)
    assert code == 0 and "waiting up to 10s" in err


def _wait_running(store, run_id, timeout=20):
    until(lambda: runs.status(store, run_id).state is runs.RunState.RUNNING, timeout, f"run {run_id} running")


QUIET = """
import os, time
# writes nothing to stdout: an agent killed under it does not take it down with SIGPIPE
mark = os.path.join(os.environ["TPUCTL_OUTPUT_DIR"], "attempts")
with open(mark, "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(float(os.environ.get("QUIET_SECONDS", "3")))
"""


def test_a_killed_agent_never_leaves_two_attempts_running(quick_local, cli, tmp_path):
    job = make_job(tmp_path, QUIET, '[env]\nQUIET_SECONDS = "600"\n')
    code, out, err = cli("submit", str(job), "-c", "faults", "--detach")
    run_id = out.strip()
    store = LocalProvider().store(quick_local)
    _wait_running(store, run_id)
    first = runs.status(store, run_id)
    kill_dead(quick_local.host.pid)                         # the agent dies; its quiet job lives on
    assert os.path.exists(f"/proc/{first.pid}")
    assert cli("up", "--provider", "local", "-c", "faults")[0] == 0   # restarts the agent
    # attempt 2 is recorded STARTING before its process exists; wait for RUNNING, well inside the 90 s staleness
    until(lambda: runs.status(store, run_id).attempt >= 2 and runs.status(store, run_id).state is runs.RunState.RUNNING,
          20, "attempt 2 running")                                          # resumed at once, not after 90 s
    second = runs.status(store, run_id)
    assert second.attempt == 2
    stat = f"/proc/{first.pid}/stat"
    assert not os.path.exists(stat) or open(stat).read().rsplit(")", 1)[1].split()[0] in "ZX"   # first one ended
    assert cli("cancel", run_id, "-c", "faults")[0] == 0


@pytest.mark.parametrize("setup,expect", [
    (lambda j, t: os.symlink(t / "secret.txt", j / "creds.txt"), "creds.txt links to"),
    (lambda j, t: os.symlink(t, j / "outside_dir"), "outside_dir links to"),
    (lambda j, t: (j / "tpuctl.toml").write_text('command = "python main.py"\nrequirements = "../req.txt"\n'),
     "is not part of the job package"),
    (lambda j, t: ((j / ".tpuctlignore").write_text("reqs/\n"), (j / "reqs").mkdir(),
                   (j / "reqs" / "r.txt").write_text("six\n"),
                   (j / "tpuctl.toml").write_text('command = "python main.py"\nrequirements = "reqs/r.txt"\n')),
     "is not part of the job package"),
])
def test_submit_refuses_what_would_not_reach_the_host(quick_local, cli, tmp_path, setup, expect):
    (tmp_path / "secret.txt").write_text("s")
    (tmp_path / "req.txt").write_text("six\n")
    job = make_job(tmp_path, "print('x')\n", name="refused")
    setup(job, tmp_path)
    before = sorted(Path(quick_local.spec.store).rglob("*"))
    code, out, err = cli("submit", str(job), "-c", "faults")
    assert code == 2 and expect in err, err
    assert sorted(Path(quick_local.spec.store).rglob("*")) == before          # nothing uploaded


def test_links_inside_the_job_travel_as_links_and_large_jobs_get_a_warning(quick_local, cli, tmp_path, monkeypatch):
    job = make_job(tmp_path, "print(open('conf/settings.txt').read())\n", name="linked")
    (job / "real_conf").mkdir()
    (job / "real_conf" / "settings.txt").write_text("from a linked directory")
    os.symlink("real_conf", job / "conf")                   # silently dropped before
    (job / "weights.bin").write_bytes(b"\0" * 300_000)
    monkeypatch.setenv("TPUCTL_PACKAGE_WARN_BYTES", "100000")
    code, out, err = cli("submit", str(job), "-c", "faults")
    assert code == 0, err
    assert out == "from a linked directory\n"
    assert "list large inputs under `data`" in err


def test_a_follower_restarts_a_dead_local_agent_and_the_run_resumes(quick_local, cli, tmp_path):
    """As systemd does for a TPU host's agent (a follower on Google gives up with exit 9 instead: test_gcp_runs):
    `logs -f` starts the local agent again, which ends the attempt its predecessor left and resumes the run."""
    import signal
    job = make_job(tmp_path, QUIET, '[env]\nQUIET_SECONDS = "2"\n', name="orphaned")
    code, out, err = cli("submit", str(job), "-c", "faults", "--detach")
    run_id = out.strip()
    store = LocalProvider().store(quick_local)
    _wait_running(store, run_id)
    os.kill(quick_local.host.pid, signal.SIGKILL)
    code, out, err = tpuctl_within(60, "logs", run_id, "-c", "faults", "-f")
    assert code == 0, err
    assert f"pid {quick_local.host.pid}) was not running: restarted it" in err
    assert "resumed" in out and "attempt 2" in out
    st = runs.status(store, run_id)
    assert st.state is runs.RunState.SUCCEEDED and st.attempt == 2
    assert state.load("faults").host.pid != quick_local.host.pid


def test_an_attached_submit_restarts_a_local_agent_killed_under_it_within_seconds(quick_local, tmp_path):
    """Issue 30: the follower of `submit` looks at the agent every few seconds (TPUCTL_REVIVE_SECONDS, 3), not only
    once the heartbeat is 90 s old: the agent is back within 10 s, says so, and the run finishes."""
    import signal
    import subprocess
    import sys
    job = make_job(tmp_path, QUIET, '[env]\nQUIET_SECONDS = "3"\n', name="attached")
    proc = subprocess.Popen([sys.executable, "-m", "tpuctl", "submit", str(job), "-c", "faults"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        store = LocalProvider().store(quick_local)
        deadline = time.monotonic() + 30
        while not runs.heartbeats(store) or not [k for k, _ in store.list(layout.RUNS_PREFIX) if "claim" in k]:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        run_id = [k for k, _ in store.list(layout.RUNS_PREFIX) if k.endswith("/claim")][0].split("/")[2]
        _wait_running(store, run_id)
        os.kill(quick_local.host.pid, signal.SIGKILL)
        killed = time.monotonic()
        while state.load("faults").host.pid == quick_local.host.pid:
            assert time.monotonic() - killed < 10, "the follower did not restart the agent within 10 s"
            time.sleep(0.1)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"the local agent of faults (pid {quick_local.host.pid}) was not running: restarted it" in err
    assert f"run {run_id}: the new agent ends what the dead one left of it and runs it again at once" in err
    assert "no heartbeat" not in err
    st = runs.status(store, run_id)
    assert st.state is runs.RunState.SUCCEEDED and st.attempt == 2


def test_a_follower_gives_the_agent_it_restarted_the_time_any_agent_has_before_calling_the_run_silent(env):
    """A run whose heartbeat is long stale when the follower restarts its agent: no "no heartbeat" warning while
    the new agent takes it over (the contradiction issue 30 saw: "no heartbeat for 90s: the local agent is
    running"), and the usual one if it still has not, a staleness period later."""
    from tpuctl.control.hostwatch import HostWatch
    from tpuctl.core.models import ClusterSpec, ClusterState, HostFacts, ProviderName

    class Prov:
        def revive(self, st, reporter):
            return ClusterState(spec=st.spec, host=HostFacts(pid=222))

        def host_state(self, st):
            return True, f"the local agent (pid {st.host.pid}) is running but has not taken the run over yet"
    now = [0.0]
    said = []
    st = ClusterState(spec=ClusterSpec(name="c", provider=ProviderName.LOCAL, store="/x"), host=HostFacts(pid=111))
    watch = HostWatch(Prov(), st, "r1", 900, said.append, reporter=None, clock=lambda: now[0])
    stale = runs.RunStatus(state=runs.RunState.RUNNING, heartbeat=time.time() - 200)
    for now[0] in (0.0, 30.0, 80.0):
        watch(stale)
    assert len(said) == 1 and "the new agent ends what the dead one left of it" in said[0]
    now[0] = 95.0
    watch(stale)
    assert len(said) == 2 and said[1].startswith("run r1 has had no heartbeat for 90s: the local agent (pid 222)")


DATA_VIEW = """
import os
root = os.environ["TPUCTL_DATA_DIR"]
for d, _, files in sorted(os.walk(root)):
    for f in sorted(files):
        p = os.path.join(d, f)
        print(os.path.relpath(p, root), open(p).read())
"""


def test_each_run_sees_exactly_the_data_submitted_with_it(quick_local, cli, tmp_path):
    job = make_job(tmp_path, DATA_VIEW, 'data = ["a/x.txt", "b/x.txt", "corpus"]\n', name="dataview")
    for d, text in (("a", "from a"), ("b", "from b")):
        (job / d).mkdir()
        (job / d / "x.txt").write_text(text)
    (job / "corpus").mkdir()
    (job / "corpus" / "one.txt").write_text("1")
    (job / "corpus" / "two.txt").write_text("2")
    outside = tmp_path / "extra.txt"
    outside.write_text("from --data")
    code, first, err = cli("submit", str(job), "-c", "faults", "--data", str(outside))
    assert code == 0, err
    # same names in two folders keep their paths; --data by its base name
    assert first == "extra.txt from --data\na/x.txt from a\nb/x.txt from b\ncorpus/one.txt 1\ncorpus/two.txt 2\n"
    run1 = cli("jobs", "-c", "faults", "--json")[1]
    (job / "corpus" / "two.txt").unlink()                 # removed locally...
    (job / "a" / "x.txt").write_text("changed")           # ...and changed
    code, second, err = cli("submit", str(job), "-c", "faults")
    assert code == 0 and "1 of 3 files sent" in err       # only the changed content went up
    assert second == "a/x.txt changed\nb/x.txt from b\ncorpus/one.txt 1\n"
    first_id = __import__("json").loads(run1)[-1]["id"]
    code, again, err = cli("logs", first_id, "-c", "faults")
    assert again == first                                  # the earlier run's log, and its data, are as they were
    data1 = Path(quick_local.spec.store) / "runs" / first_id / "data"
    assert (data1 / "a/x.txt").read_text() == "from a" and (data1 / "corpus/two.txt").exists()


def test_two_data_paths_that_would_collide_are_refused(quick_local, cli, tmp_path):
    job = make_job(tmp_path, DATA_VIEW, name="clash")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    for d in ("one", "two"):
        (tmp_path / d / "x.txt").write_text(d)
    code, out, err = cli("submit", str(job), "-c", "faults", "--data", str(tmp_path / "one" / "x.txt"),
                         "--data", str(tmp_path / "two" / "x.txt"))
    assert code == 2 and "would land at x.txt" in err
