"""Ctrl-C during `submit`'s data upload (issue 30): it says what was stopped and what was kept, a run that was never
submitted leaves no data, the blobs that reached the store stay whole (the next submit does not send them again);
and what a submit killed outright, or an earlier release, left is shown by `status` and `ls` and removed by `down`."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tpuctl_at_a_terminal, until

from tpuctl.core import layout, orphans
from tpuctl.core.store import LocalStore

# The real CLI in its own process, with SIGINT sent to itself at the worst moments: while the Nth data copy into
# the run's directory is under way (other workers uploading and copying beside it), or in the middle of an upload.
INTERRUPTING = """
import os, signal, sys, threading, time
from tpuctl.core import store
moment, n = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGINT, signal.default_int_handler)   # as at a terminal (a background job starts ignoring it)
seen = [0]
lock = threading.Lock()
def counted():
    with lock:
        seen[0] += 1
        return seen[0]
copy, upload = store.LocalStore.copy, store.LocalStore.upload_file
def interrupting_copy(self, src, dst):
    if moment.startswith("copy") and counted() == n:
        # This copy is on the wire as Ctrl-C comes: the server completes it whatever this process does next (a
        # thread that is not a daemon: the interpreter waits for it at exit), and its answer takes 0.5 s.
        landing = threading.Timer(0.5, copy, (self, src, dst))
        landing.daemon = False   # it would inherit the worker's daemon flag
        landing.start()
        os.kill(os.getpid(), signal.SIGINT)
        if moment == "copy twice":
            time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGINT)   # impatient hands: a second Ctrl-C while it stops
        landing.join()
        return
    copy(self, src, dst)
def interrupting_upload(self, path, key, progress):
    def half_way(k):
        if moment == "upload" and counted() == n:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        progress(k)
    upload(self, path, key, half_way)
create = store.LocalStore.create
def interrupting_create(self, key, data):
    if moment == "job.json" and key.endswith("/job.json"):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)       # as the run is being written
    return create(self, key, data)
store.LocalStore.copy, store.LocalStore.upload_file = interrupting_copy, interrupting_upload
store.LocalStore.create = interrupting_create
from tpuctl.cli import main
main(sys.argv[3:])
"""

FILES = 60


@pytest.fixture
def big_job(tmp_path):
    job = tmp_path / "bigdata"
    (job / "corpus").mkdir(parents=True)
    (job / "tpuctl.toml").write_text('command = "python main.py"\ndata = ["corpus"]\n')
    (job / "main.py").write_text("import os\nprint(len(os.listdir(os.path.join(os.environ['TPUCTL_DATA_DIR'], "
                                 "'corpus'))), 'files')\n")
    for i in range(FILES):   # distinct contents, 3 MiB each: an upload is several 1 MiB progress steps
        (job / "corpus" / f"part{i:03d}.bin").write_bytes(os.urandom(3 << 20))
    return job


def unaccounted(store_root: Path) -> list[str]:
    """What the store holds besides the cluster's own records and whole blobs: run data, runs, marks, partials."""
    store = LocalStore(str(store_root))
    bad = [k for k, _ in store.list(layout.OUTPUTS_PREFIX)]
    bad += [k for k, _ in store.list(layout.RUNS_PREFIX)] + [k for k, _ in store.list(layout.SUBMITTING_PREFIX)]
    bad += [k for k, _ in store.list(layout.QUEUE_PREFIX)] + [k for k, _ in store.list(layout.RUN_INDEX_PREFIX)]
    bad += [str(p) for p in store_root.rglob("*") if p.name.startswith(".tpuctl-partial")]
    for key, _ in store.list(layout.BLOBS_PREFIX):
        if hashlib.md5((store_root / key).read_bytes()).hexdigest() != key.rsplit("/", 1)[1]:
            bad.append(f"{key} is not whole")
    return bad


@pytest.mark.parametrize("moment,n,stop_wait", [("copy", 3, "5"), ("copy", 3, "0"), ("copy twice", 3, "5"),
                                               ("upload", 25, "5")])
def test_ctrl_c_during_the_data_upload_leaves_nothing_unaccounted(local_up, cli, big_job, moment, n, stop_wait,
                                                                  monkeypatch):
    """stop_wait 0: the uploads in flight are not waited for, as with a large one to a bucket; a copy into the
    run's directory under way still is, so none lands after the run's data is removed."""
    monkeypatch.setenv("TPUCTL_STOP_WAIT", stop_wait)
    st = local_up("sigint")
    root = Path(st.spec.store)
    proc = subprocess.run([sys.executable, "-c", INTERRUPTING, moment, str(n), "submit", str(big_job), "-c",
                           "sigint"], capture_output=True, text=True, timeout=120)
    err = proc.stderr
    assert proc.returncode == 130, err
    # the package is said once as it starts and once as it ends (issue 63.6: its time is the upload's), never again
    assert "Traceback" not in err and err.count("package ") == 2 and err.count(" uploaded ") <= 1, err
    assert "submit stopped while sending data: run " in err and "was never submitted and keeps no data" in err
    kept = len(LocalStore(str(root)).list(layout.BLOBS_PREFIX))
    assert 0 < kept < FILES and f"{kept} of {FILES} new data contents" in err and "stay there" in err
    assert unaccounted(root) == []
    assert json.loads(cli("status", "-c", "sigint", "--json")[1])["orphan_data"] == ""
    code, out, err = cli("submit", str(big_job), "-c", "sigint")
    assert code == 0 and out == f"{FILES} files\n", err
    assert f"{FILES - kept} of {FILES} files sent" in err   # what reached the store was not sent again


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_a_submit_killed_outright_leaves_a_mark_that_status_and_ls_show_and_down_removes(local_up, cli, big_job,
                                                                                        reaped):
    """Killed, whether or not its parent reaped it yet (a zombie still answers `kill -0`; a container's init may
    never reap what it inherits)."""
    st = local_up("killed")
    root = Path(st.spec.store)
    store = LocalStore(str(root))
    proc = subprocess.Popen([sys.executable, "-m", "tpuctl", "submit", str(big_job), "-c", "killed"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not [k for k, _ in store.list(layout.OUTPUTS_PREFIX)]:   # the first copy into the run's directory
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.kill()
    if reaped:
        proc.wait()
    else:
        until(lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 30,
              "the killed submit to be a zombie")
    [mark] = [k for k, _ in store.list(layout.SUBMITTING_PREFIX)]
    run_id = mark.rsplit("/", 1)[1]
    assert store.read(layout.run_job(run_id)) is None
    said = json.loads(cli("status", "-c", "killed", "--json")[1])["orphan_data"]
    assert f"of 1 run never submitted ({run_id}: a submit on this machine (pid {proc.pid})" in said
    assert "`tpuctl down -c killed` removes it" in said
    code, out, err = cli("ls")
    assert "1 run never submitted" in out
    code, out, err = cli("down", "-c", "killed", "--yes")
    assert code == 0 and "never submitted" in err and "deleted" in err, err
    assert store.list(layout.OUTPUTS_PREFIX) == [] and store.list(layout.SUBMITTING_PREFIX) == []
    proc.wait()


def test_run_data_an_earlier_release_left_without_a_run_is_found_once_and_removed_by_down(local_up, cli):
    st = local_up("legacy")
    store = LocalStore(st.spec.store)
    orphan = "20261101-120000-000-0bad"

    def plant():
        store.delete(layout.ORPHANS_CHECKED)   # a store an earlier release used: no marks
        store.write(layout.run_data(orphan) + "corpus/part0.bin", b"x" * 1000)
    plant()
    store.write(layout.run_output(orphan) + "/data/not-run-data.txt", b"an output")   # outputs are no run data
    said = json.loads(cli("status", "-c", "legacy", "--json")[1])["orphan_data"]
    assert said.startswith(f"1.0 kB of data (1 files) of 1 run never submitted ({orphan}: a submit of an earlier")
    assert store.read(layout.ORPHANS_CHECKED) is not None   # listed once; from now on the marks say it
    code, out, err = cli("down", "-c", "legacy", "--yes")
    assert code == 0 and "of 1 run never submitted" in err, err
    assert orphans.find(store) == [] and store.list(layout.run_data(orphan)) == []
    assert store.read(layout.run_output(orphan) + "/data/not-run-data.txt") == b"an output"
    plant()
    code, out, err = cli("down", "-c", "legacy", "--yes")   # already down: it goes all the same
    assert code == 0 and "of 1 run never submitted" in err and "already down" in err, err
    assert orphans.find(store) == []


def test_ctrl_c_while_a_large_upload_to_a_bucket_is_half_sent_leaves_no_object_and_no_run(cloud, cli, no_leak,
                                                                                         tmp_path):
    """On Google Cloud an upload in flight cannot be stopped part way: the submit exits without waiting for it, and
    Cloud Storage makes no object of a resumable upload that never completed (cloud.google.com/storage/docs/
    resumable-uploads: the object is created when the final chunk is received). SIGINT lands while the first
    16 MiB chunk of a 40 MiB file is on the wire."""
    from conftest import PROJECT
    from google.cloud import storage
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "gi", "--runtime",
                         "tpu-vm-tf-2.18.0-pjrt-v5p-and-below")
    assert code == 0, err
    job = tmp_path / "j"
    (job / "corpus").mkdir(parents=True)
    (job / "tpuctl.toml").write_text('command = "python main.py"\ndata = ["corpus"]\n')
    (job / "main.py").write_text("print('never')\n")
    (job / "corpus" / "big.bin").write_bytes(os.urandom(40 << 20))
    proc = subprocess.Popen(tpuctl_at_a_terminal("submit", str(job), "-c", "gi"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    original = cloud.gcs.forward
    chunks = []

    def interrupt_mid_upload(method, path, headers, body, identity=None):
        if method == "PUT" and path.startswith("/upload/"):
            chunks.append(len(body or b""))
            if len(chunks) == 1:
                proc.send_signal(signal.SIGINT)
                time.sleep(0.5)            # the chunk is still on the wire as the CLI takes the interrupt
        return original(method, path, headers, body, identity)
    cloud.gcs.forward = interrupt_mid_upload
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        cloud.gcs.forward = original
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "was never submitted and keeps no data; 0 of 1 new data contents (0 B)" in err
    time.sleep(1)   # whatever the abandoned upload would still do
    names = [b.name for b in storage.Client(project=PROJECT).list_blobs(f"{PROJECT}-tpuctl-gi")]
    assert not [n for n in names if n.startswith(("tpuctl/blobs/", "runs/", "tpuctl/runs/", "tpuctl/submitting/",
                                                  "tpuctl/queue/", "tpuctl/index/runs/"))], names


@pytest.mark.parametrize("mark", [b"\x00garbage", b'{"host": 5, "pid": "x", "time": []}', b"[]"])
def test_a_corrupt_mark_is_an_orphan_that_down_still_removes(local_up, cli, mark):
    st = local_up("corrupt")
    store = LocalStore(st.spec.store)
    orphan = "20261101-120000-000-0bad"
    store.write(layout.run_data(orphan) + "x.bin", b"x")
    store.write(layout.submitting(orphan), mark)
    code, out, err = cli("status", "-c", "corrupt", "--json")
    assert code == 0 and "1 run never submitted" in json.loads(out)["orphan_data"], err
    code, out, err = cli("down", "-c", "corrupt", "--yes")
    assert code == 0 and "never submitted" in err, err
    assert store.list(layout.OUTPUTS_PREFIX) == [] and store.list(layout.SUBMITTING_PREFIX) == []


def test_ctrl_c_as_the_run_is_written_lets_it_be_written_whole_and_says_it_runs(local_up, cli, big_job):
    st = local_up("written")
    store = LocalStore(st.spec.store)
    proc = subprocess.run([sys.executable, "-c", INTERRUPTING, "job.json", "0", "submit", str(big_job), "-c",
                           "written"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert "was submitted as Ctrl-C came, and runs" in proc.stderr and "tpuctl logs " in proc.stderr
    [job_key] = [k for k, _ in store.list(layout.RUNS_PREFIX) if k.endswith("/job.json")]
    run_id = job_key.split("/")[2]
    assert store.list(layout.SUBMITTING_PREFIX) == []          # its data is its own
    code, out, err = cli("logs", run_id, "-c", "written", "-f")   # queued and indexed: the agent runs it
    assert code == 0 and out == f"{FILES} files\n", err
