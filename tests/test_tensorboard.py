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
