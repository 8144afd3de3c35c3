"""The agent when its store fails under it (host/storeguard.py): a store that fills mid-run, one that cannot be read
when the agent starts, and a local agent that died being started again by the next command."""
import errno
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import kill_dead, until
from jobs import make_job, submit_to_store
from tpuctl.core import layout, runs
from tpuctl.core.runs import RunState
from tpuctl.core.store import LocalStore
from tpuctl.host.agent import Agent

# prints `n` 100-byte lines numbered in order, then waits for a flag file when asked to
PRINTER = """
import os, sys, time
n, wait = int(sys.argv[1]), len(sys.argv) > 2
for i in range(n):
    sys.stdout.write(f"{i:08d}" + "x" * 91 + "\\n")
sys.stdout.flush()
while wait and not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
print("done", flush=True)
"""


class CappedStore(LocalStore):
    """A directory store on a disk of `cap` bytes: writes past it fail as a full disk does (ENOSPC)."""

    def __init__(self, root, cap):
        super().__init__(root)
        self.cap = cap

    def used(self):
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())

    def free_bytes(self):
        return max(0, self.cap - self.used())

    def _tmp(self, p, data):
        if len(data) > self.free_bytes():
            raise OSError(errno.ENOSPC, "No space left on device", str(p))
        return super()._tmp(p, data)


def _log(store, run_id):
    return b"".join(store.read(k) or b"" for k, _ in store.list(layout.run_logs(run_id, 0))).decode()


def _wait_final(store, run_id, seconds=60):
    until(lambda: runs.status(store, run_id).state.final, seconds,
          lambda: f"run {run_id}'s end: {runs.status(store, run_id)}")
    return runs.status(store, run_id)


@pytest.fixture
def capped_agent(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("TPUCTL_STORE_FLOOR_BYTES", str(100_000))
    monkeypatch.setenv("TPUCTL_LOG_HOLD_WAIT", "1")   # how long a run's end waits for room for its held output
    root = tmp_path / "store"
    writer = LocalStore(root)                 # what `submit` writes: not capped, as another disk would be
    agent = Agent(str(root), home=str(tmp_path / "agent"), poll=0.05)
    agent.store = agent.guard.store = CappedStore(root, cap=0)
    thread = threading.Thread(target=agent.run_forever, daemon=True)

    def start(cap):
        agent.store.cap = agent.store.used() + cap
        thread.start()
    yield agent, writer, start
    agent.stop.set()
    thread.join(30)
    assert not thread.is_alive()


def test_a_store_that_fills_mid_run_settles_the_run_and_the_agent_keeps_serving(capped_agent, tmp_path, capfd):
    agent, writer, start = capped_agent
    job = make_job(tmp_path, PRINTER)
    big = submit_to_store(writer, job)
    writer.write(layout.run_job(big), json.dumps({**json.loads(writer.read(layout.run_job(big))),
                                                  "args": ["6000"]}).encode())          # 600 kB of output
    start(cap=400_000)
    st = _wait_final(writer, big)
    assert st.state is RunState.SUCCEEDED and st.exit_code == 0
    # ended at once with its output waiting (issue 38.9), given up on after TPUCTL_LOG_HOLD_WAIT
    until(lambda: "bytes of output were not shipped" in runs.status(writer, big).note, 15, "the held output lost")
    st = runs.status(writer, big)
    assert st.state is RunState.SUCCEEDED and "bytes of output were not shipped (store full" in st.note, st
    shipped = _log(writer, big)
    lines = shipped.splitlines()
    assert lines and lines[0].startswith("00000000") and len(lines) < 6000
    assert all(line[:8] == f"{i:08d}" for i, line in enumerate(lines[:-2]))   # in order, nothing skipped
    assert lines[-1].startswith("tpuctl agent: ") and "bytes of output were not shipped (store full" in lines[-1]
    assert agent.store.free_bytes() > 0                                        # the floor held
    # the agent is alive and the next run runs, its first lines shipped
    small = submit_to_store(writer, make_job(tmp_path, "print('hello after a full store')\n", name="small"))
    st = _wait_final(writer, small)
    assert st.state is RunState.SUCCEEDED and "hello after a full store" in _log(writer, small)
    err = capfd.readouterr().err
    assert err.count("store full") >= 1 and "Traceback" not in err


def test_output_held_while_the_store_is_full_is_shipped_once_space_returns(capped_agent, tmp_path):
    agent, writer, start = capped_agent
    flag = tmp_path / "go"
    run_id = submit_to_store(writer, make_job(tmp_path, PRINTER))
    writer.write(layout.run_job(run_id), json.dumps({**json.loads(writer.read(layout.run_job(run_id))),
                                                     "args": ["5000", str(flag)]}).encode())
    start(cap=300_000)
    until(lambda: "store full" in runs.status(writer, run_id).note, 30, "the note")   # said in the status while it runs
    assert runs.status(writer, run_id).state is RunState.RUNNING
    agent.store.cap += 10_000_000                                  # space returns
    flag.touch()
    st = _wait_final(writer, run_id)
    assert st.state is RunState.SUCCEEDED and st.note == "", st
    lines = _log(writer, run_id).splitlines()
    assert [line[:8] for line in lines[:5000]] == [f"{i:08d}" for i in range(5000)] and lines[-1] == "done"


def test_output_held_when_the_job_ends_does_not_hold_the_run_or_the_queue_and_ships_when_space_returns(
        capped_agent, tmp_path, monkeypatch):
    """Issue 38.9 (after 28.5): the store still full when the job has ended. The run ends at once, its note saying
    what waits ("store full: N MB waiting"); the next run starts meanwhile (its first lines fit the floor's
    allowance); the held output (under the 8 MiB bound) ships in full once there is room, and the note is cleared.
    Before, the run stayed `running` for TPUCTL_LOG_HOLD_WAIT (300 s) and the next waited behind it."""
    monkeypatch.setenv("TPUCTL_LOG_HOLD_WAIT", "60")
    agent, writer, start = capped_agent
    run_id = submit_to_store(writer, make_job(tmp_path, PRINTER))
    writer.write(layout.run_job(run_id), json.dumps({**json.loads(writer.read(layout.run_job(run_id))),
                                                     "args": ["5000"]}).encode())
    nxt = submit_to_store(writer, make_job(tmp_path, "print('next run')\n", name="next"))
    start(cap=300_000)
    st = _wait_final(writer, run_id, 15)
    assert st.state is RunState.SUCCEEDED and st.exit_code == 0
    assert st.note.startswith("store full: ") and "MB of output waiting to be shipped" in st.note, st
    st = _wait_final(writer, nxt, 15)                              # the queue moved on
    assert st.state is RunState.SUCCEEDED and "next run" in _log(writer, nxt)
    assert "done" not in _log(writer, run_id)
    agent.store.cap += 10_000_000                                  # space returns after the job's end
    until(lambda: runs.status(writer, run_id).note == "", 30, "the held output shipped")
    lines = _log(writer, run_id).splitlines()
    assert [line[:8] for line in lines[:5000]] == [f"{i:08d}" for i in range(5000)] and lines[-1] == "done"


def test_the_agent_waits_for_a_store_it_cannot_read_yet(tmp_path, capfd):
    class Unreadable(LocalStore):
        fails = 4

        def read(self, key):
            if self.fails:
                self.fails -= 1
                raise OSError(errno.EIO, "Input/output error (the store is not up yet)")
            return super().read(key)
    root = tmp_path / "store"
    run_id = submit_to_store(LocalStore(root), make_job(tmp_path, "print('served')\n"))
    agent = Agent(str(root), home=str(tmp_path / "agent"), poll=0.02)
    agent.store = agent.guard.store = Unreadable(root)
    thread = threading.Thread(target=agent.run_forever, daemon=True)
    thread.start()
    try:
        st = _wait_final(LocalStore(root), run_id)
    finally:
        agent.stop.set()
        thread.join(30)
    assert st.state is RunState.SUCCEEDED and "served" in _log(LocalStore(root), run_id)
    err = capfd.readouterr().err
    assert err.count("not readable yet") >= 3 and "try 1, next in" in err and "Traceback" not in err


def test_a_killed_local_agent_is_restarted_by_the_next_submit_and_logs(local_up, cli, tmp_path):
    st = local_up("revive")
    kill_dead(st.host.pid)
    code, out, err = cli("submit", str(make_job(tmp_path, "print('ran')\n")), "-c", "revive")
    assert code == 0 and out.strip() == "ran", err
    assert "was not running: restarted it" in err
    from tpuctl.core import state
    pid = state.load("revive").host.pid
    assert pid != st.host.pid
    kill_dead(pid)
    code, out, err = cli("submit", str(make_job(tmp_path, "print('again')\n", name="j2")), "-c", "revive",
                         "--detach")
    assert code == 0 and "restarted it" in err
    kill_dead(state.load("revive").host.pid)
    code, out, err = cli("logs", "-c", "revive", "-f")
    assert code == 0 and out.strip() == "again" and "restarted it" in err, err


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_the_local_agent_survives_a_6mb_store_under_a_20mb_log(env, cli, tmp_path, monkeypatch):
    """As on a user's machine: the cluster's data directory on a 6 MB tmpfs (where mounting is allowed)."""
    monkeypatch.setenv("TPUCTL_LOG_HOLD_WAIT", "8")   # how long a run's held output waits for room
    data = tmp_path / "home" / "data"
    if not _mount_tmpfs(data, "6m"):
        pytest.skip("cannot mount a tmpfs here (needs root); the capped-store tests cover the same paths")
    from tpuctl.core import state
    try:
        assert cli("up", "--provider", "local", "-c", "full")[0] == 0
        job = make_job(tmp_path, "import sys\nfor i in range(200_000):\n    sys.stdout.write('%099d\\n' % i)\n"
                                 "print('the end', flush=True)\n")
        code, out, err = cli("submit", str(job), "-c", "full", "--detach")
        assert code == 0 and "Traceback" not in err, err[-2000:]
        _wait_final(LocalStore(state.load("full").spec.store), out.strip())
        [row] = json.loads(cli("jobs", "-c", "full", "--json")[1])
        # ended at once, its output said to wait (issue 38.9), not `running` for TPUCTL_LOG_HOLD_WAIT
        assert row["state"] == "succeeded" and row["note"].startswith("store full: ") and " MB of output waiting" \
            in row["note"], row
        code, out, err = cli("submit", str(make_job(tmp_path, "print('still serving')\n", name="next")), "-c", "full")
        assert code == 0 and out.strip() == "still serving", err
        assert "was not running" not in err            # the agent never died
        info = json.loads(cli("status", "-c", "full", "--json")[1])
        assert info["problem"].startswith("the store is full") and "make room where the store lives" in info["fix"]
        until(lambda: "not shipped (store full" in json.loads(cli("jobs", "-c", "full", "--json")[1])[-1]["note"],
              15, "the held output given up on after TPUCTL_LOG_HOLD_WAIT")
        assert cli("down", "-c", "full", "--yes")[0] == 0
    finally:
        from tpuctl.providers.local import LocalProvider
        for s in state.all_clusters():
            LocalProvider()._stop(s, lambda m: None)
        subprocess.run(["umount", "-l", str(data)], capture_output=True)


def test_a_store_the_job_itself_fills_refuses_every_record_until_space_returns(capped_agent, tmp_path):
    """No floor helps when the job fills the disk: heartbeats and statuses fail, the agent lives on, and the run's
    final status is written once there is room again."""
    agent, writer, start = capped_agent
    hog = "import os\nopen(os.path.join(os.environ['TPUCTL_OUTPUT_DIR'], 'hog'), 'wb').write(b'0' * 500_000)\n" \
          "print('filled', flush=True)\n"
    run_id = submit_to_store(writer, make_job(tmp_path, hog))
    start(cap=300_000)
    hog_file = Path(writer.local_path(layout.run_output(run_id))) / "hog"
    until(hog_file.exists, 30, "the job's output")
    time.sleep(1.5)                                   # the job has ended; its final status cannot be written
    assert not runs.status(writer, run_id).state.final
    hog_file.unlink()                                 # space returns
    st = _wait_final(writer, run_id)
    assert st.state is RunState.SUCCEEDED
    assert not agent.stop.is_set()


def test_a_store_the_jobs_checkpoints_fill_to_0_bytes_settles_the_run_and_starts_the_next(capped_agent, tmp_path):
    """Issue 52.7: the job's own checkpoints took the store to 0 bytes free (as a real disk stops a writer at 0):
    the run stayed `running` after its job ended and the queued run did not start. The agent's reserve (the floor,
    held back as a file) is released for records: the run settles at once, the next one runs, and the reserve is
    made again once there is room."""
    agent, writer, start = capped_agent
    ckpt = "import os, sys\nopen(os.path.join(os.environ['TPUCTL_OUTPUT_DIR'], 'ckpt'), 'wb').write(b'0' * " \
           "int(sys.argv[1]))\nprint('saved', flush=True)\n"
    run_id = submit_to_store(writer, make_job(tmp_path, ckpt))
    writer.write(layout.run_job(run_id), json.dumps({**json.loads(writer.read(layout.run_job(run_id))),
                                                     "args": ["300000"]}).encode())
    nxt = submit_to_store(writer, make_job(tmp_path, "print('next run')\n", name="next"))
    reserve = Path(writer.local_path(".tpuctl-reserve"))
    start(cap=400_000)                                # 100 kB of it the reserve, 300 kB the checkpoint
    ckpt_file = Path(writer.local_path(layout.run_output(run_id))) / "ckpt"
    # the reserve made at the agent's start; on a loaded machine the job may fill the store, and the agent release
    # the reserve, between two polls here (CI saw it so): its making again, below, shows it too
    until(lambda: reserve.exists() or ckpt_file.exists(), 10, "the reserve made at the agent's start")
    until(ckpt_file.exists, 30, "the checkpoint")
    until(lambda: agent.store.free_bytes() == 0 or runs.status(writer, run_id).state.final, 10, "0 bytes free")
    st = _wait_final(writer, run_id, 10)
    assert st.state is RunState.SUCCEEDED and st.exit_code == 0, st
    st = _wait_final(writer, nxt, 15)                 # the queue moved on
    assert st.state is RunState.SUCCEEDED and "next run" in _log(writer, nxt)
    assert not reserve.exists()
    ckpt_file.unlink()                                # room again
    third = submit_to_store(writer, make_job(tmp_path, "print('third')\n", name="third"))
    assert _wait_final(writer, third).state is RunState.SUCCEEDED
    until(reserve.exists, 10, "the reserve made again")


def test_submit_and_status_name_a_full_store_and_the_fix(local_up, cli, tmp_path, monkeypatch):
    """Issue 52.7: at 0 bytes free `submit` said "internal error: OSError [Errno 28] ... please report it" and
    `status` never named the full store (the agent's heartbeat, which would, cannot be written then)."""
    local_up("sfull")
    from tpuctl.core import store as store_mod

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(store_mod.LocalStore, "free_bytes", lambda self: 0)   # this process's view: the CLI's
    monkeypatch.setattr(store_mod.LocalStore, "_tmp", full)
    monkeypatch.setattr(store_mod, "_copy_file", full)
    code, out, err = cli("submit", str(make_job(tmp_path, "print('x')\n")), "-c", "sfull")
    assert code == 1 and "error: store full: " in err and " has 0 bytes free" in err, err
    assert "hint: make room where the store lives" in err and "internal error" not in err and "Traceback" not in err
    info = json.loads(cli("status", "-c", "sfull", "--json")[1])
    assert info["problem"].startswith("the store is full: 0 bytes free") and "make room" in info["fix"], info
    assert json.loads(cli("jobs", "-c", "sfull", "--json")[1]) == []   # nothing of the run was left
