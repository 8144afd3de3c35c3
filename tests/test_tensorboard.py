"""`tpuctl tensorboard` through the real CLI, checked over HTTP as a browser would read it: the scalars of a run
in the local store (read in place) and of a run in a bucket (synced, then synced again as the file grows)."""
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from conftest import PROJECT
from tpuctl.core import layout, runindex

pytest.importorskip("tensorboard")
RUN = "20261122-120000-abcd"


def _events(directory, steps, start=0):
    """Event files as TensorFlow writes them (TensorBoard's own writer: no TF needed)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    w = EventFileWriter(str(directory))
    for step in range(start, start + steps):
        w.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="epoch_loss", simple_value=8.0 - step / 10)])))
    w.close()
    return w.get_logdir()


def _job_json(run_id=RUN):
    return json.dumps({"id": run_id, "name": "j", "command": "x", "package": "0" * 64}).encode()


def _stop(p):
    """SIGTERM the CLI: it must take its TensorBoard down with it."""
    p.terminate()
    p.wait(20)
    assert p.returncode == 143
    # Only a TensorBoard of this test's CLI: orphaned when the CLI died, it is this process's child now (conftest
    # makes every test process a subreaper). Another test's, on another pytest-xdist worker or in another suite,
    # serves the same RUN: matched by its command line alone, it failed this test when the two ran side by side.
    tb = [pid for pid in os.listdir("/proc") if pid.isdigit() and _ppid(pid) == os.getpid()
          and _cmd(pid).startswith(sys.executable) and "tensorboard.main" in _cmd(pid) and f"{RUN}:" in _cmd(pid)]
    assert not tb, "TensorBoard outlived the CLI"


def _ppid(pid):
    """The parent's pid (/proc/PID/stat: the fourth field, after the command name in parentheses), or 0."""
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _cmd(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _serve(args, timeout=90):
    p = subprocess.Popen([sys.executable, "-m", "tpuctl", "tensorboard", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    line = ""
    while time.time() < deadline and not line:
        line = p.stdout.readline().strip()
        if p.poll() is not None:
            break
    assert line.startswith("http://"), p.stderr.read() if p.poll() is not None else "no URL printed"
    return p, line


def _scalars(url, run, tag="epoch_loss", want=1, timeout=60):
    q = urllib.parse.urlencode({"run": run, "tag": tag})
    deadline = time.time() + timeout
    got = []
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}data/plugin/scalars/scalars?{q}", timeout=5) as r:
                got = json.loads(r.read())
            if len(got) >= want:
                return [(step, round(value, 4)) for _, step, value in got]
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{run}: {len(got)} points after {timeout}s")


def _local_run(local_up, name, steps):
    from tpuctl.providers.local import LocalProvider
    st = local_up(name)
    store = LocalProvider().store(st)
    store.write(layout.run_job(RUN), _job_json())
    runindex.register(store, RUN)                # as submit writes it: `tensorboard` with no id finds it there
    out_dir = os.path.join(st.spec.store, layout.run_output(RUN), "tensorboard", "train")
    os.makedirs(out_dir)
    _events(out_dir, steps)


def test_tensorboard_serves_a_local_runs_scalars(local_up):
    _local_run(local_up, "tb", 5)
    p = None
    try:
        p, url = _serve(["-c", "tb"])
        points = _scalars(url, f"{RUN}/tensorboard/train", want=5)
        assert points == [(s, 8.0 - s / 10) for s in range(5)]
    finally:
        if p:
            _stop(p)


def test_two_tensorboards_started_at_once_each_serve_their_own_runs(local_up):
    """Started together, each on the first free port: they once both probed the same free port, one TensorBoard
    lost it and exited, and its CLI announced the other's URL as its own (then exited 1)."""
    _local_run(local_up, "tb-a", 3)
    _local_run(local_up, "tb-b", 6)
    started = []
    try:
        for name in ("tb-a", "tb-b"):      # both CLIs start before either TensorBoard has bound a port
            started.append(subprocess.Popen([sys.executable, "-m", "tpuctl", "tensorboard", "-c", name],
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        urls = [p.stdout.readline().strip() for p in started]
        assert all(u.startswith("http://") for u in urls) and urls[0] != urls[1], urls
        assert len(_scalars(urls[0], f"{RUN}/tensorboard/train", want=3)) == 3
        assert len(_scalars(urls[1], f"{RUN}/tensorboard/train", want=6)) == 6
    finally:
        for p in started:
            _stop(p)


def test_tensorboard_syncs_a_buckets_event_files_as_they_grow(cloud, cli, tmp_path, monkeypatch):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    from google.cloud import storage
    bucket = storage.Client(project=PROJECT).bucket(f"{PROJECT}-tpuctl-bert")
    bucket.blob(layout.run_job(RUN)).upload_from_string(_job_json())
    local = tmp_path / "events"
    events = _events(local, 3)
    name = os.listdir(events)[0]
    key = f"{layout.run_output(RUN)}/tensorboard/{name}"
    bucket.blob(key).upload_from_filename(os.path.join(events, name))
    monkeypatch.setenv("TPUCTL_TB_SYNC_SECONDS", "0.5")
    p = None
    try:
        p, url = _serve(["-c", "bert", RUN])
        assert _scalars(url, f"{RUN}/tensorboard", want=3) == [(s, 8.0 - s / 10) for s in range(3)]
        # the job goes on writing: TF rewrites the whole object in a bucket; the CLI fetches it again
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter
        with open(os.path.join(events, name), "ab") as f:
            w = RecordWriter(f)
            for step in (3, 4):
                w.write(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(
                    value=[summary_pb2.Summary.Value(tag="epoch_loss", simple_value=8.0 - step / 10)]))
                        .SerializeToString())
        bucket.blob(key).upload_from_filename(os.path.join(events, name))
        try:
            assert len(_scalars(url, f"{RUN}/tensorboard", want=5)) == 5
        except AssertionError:
            p.terminate()
            raise AssertionError(p.stderr.read()[-3000:])
    finally:
        if p:
            _stop(p)


def test_without_tensorboard_one_line_names_the_extra(env, cli, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n, *a))
    code, out, err = cli("tensorboard", "-c", "x")
    assert code == 2 and "TensorBoard is not installed" in err and "tpuctl[tensorboard]" in err


# A TensorBoard as `python -m tensorboard.main` starts it, for serve(): its first start loses the port race as
# werkzeug reports it (werkzeug/serving.py BaseWSGIServer.__init__ on EADDRINUSE: the OS error's text, then "Port
# N is in use by another program. ...", exit 1), the next binds a free port and says so as TensorBoard does.
RACED_THEN_SERVES = """#!{python}
import os, socket, sys, time
starts = os.path.join({state!r}, "starts")
open(starts, "a").write("x")
if len(open(starts).read()) <= {races}:
    print("Address already in use", file=sys.stderr)
    print("Port 6006 is in use by another program. Either identify and stop that program, or start the server "
          "with a different port.", file=sys.stderr)
    sys.exit(1)
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(f"TensorBoard 2.20.0 at http://localhost:{{s.getsockname()[1]}}/ (Press CTRL+C to quit)", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("races, served", [(1, True), (3, True), (4, False)])
def test_a_tensorboard_that_lost_its_port_to_another_is_started_again(tmp_path, monkeypatch, races, served):
    """Two TensorBoards started at once (two `tpuctl tensorboard`, two test suites) can find the same port free and
    one loses the bind; werkzeug then ends it instead of TensorBoard's scan going on to the next port. tpuctl starts
    it again (board.PORT_RACES times) before it gives up in one line."""
    from tpuctl.cli import tensorboard as board
    from tpuctl.core.errors import TpuctlError
    monkeypatch.setenv("TPUCTL_HOME", str(tmp_path / "home"))
    fake = tmp_path / "python"
    fake.write_text(RACED_THEN_SERVES.format(python=sys.executable, state=str(tmp_path), races=races))
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    said: list[str] = []

    class Sources:
        def sync(self):
            return 0

        def logdir_spec(self):
            return "r:" + str(tmp_path)
    if served:
        assert board.serve(Sources(), None, "127.0.0.1", said.append, stopped=lambda: bool(said)) == 0
        assert said and said[0].startswith("http://localhost:"), said
    else:
        with pytest.raises(TpuctlError, match="is in use by another program"):
            board.serve(Sources(), None, "127.0.0.1", said.append)
        assert said == []
    assert len((tmp_path / "starts").read_text()) == min(races + 1, board.PORT_RACES + 1)
