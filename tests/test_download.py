"""`tpuctl download`: a run's outputs back, incrementally, from the local store and from a bucket."""
import json
import os

import pytest

from conftest import PROJECT
from jobs import make_job
from tpuctl.core import layout, runindex
from tpuctl.control.download import outputs
from tpuctl.core.errors import TpuctlError

OUTPUT_JOB = """
import os
out = os.environ["TPUCTL_OUTPUT_DIR"]
os.makedirs(out + "/ckpt", exist_ok=True)
open(out + "/ckpt/weights.bin", "wb").write(os.urandom(300_000))
open(out + "/metrics.json", "w").write('{"step": 3}')
print("done")
"""


@pytest.fixture
def local(local_up):
    return local_up("dl")


def test_download_fetches_a_runs_outputs_then_only_what_changed(local, cli, tmp_path, monkeypatch):
    code, out, err = cli("submit", str(make_job(tmp_path, OUTPUT_JOB)), "-c", "dl")
    assert code == 0, err
    run_id = json.loads(cli("jobs", "-c", "dl", "--json")[1])[0]["id"]
    assert f"fetch them: tpuctl download {run_id} -c dl" in err        # the end of every run says how
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("download", "-c", "dl")
    assert code == 0 and "2 of 2 files fetched" in err, err
    elsewhere = tmp_path / "elsewhere"
    store_out = os.path.join(local.spec.store, layout.run_output(run_id))
    assert (tmp_path / run_id / "ckpt" / "weights.bin").read_bytes() == \
        open(os.path.join(store_out, "ckpt", "weights.bin"), "rb").read()
    code, out, err = cli("download", run_id, "-c", "dl")
    assert code == 0 and "0 of 2 files fetched" in err
    (tmp_path / run_id / "metrics.json").write_text('{"step": 0}')      # same size, other bytes: fetched again
    open(os.path.join(store_out, "new.txt"), "w").write("more")
    code, out, err = cli("download", run_id, "-c", "dl", "-o", str(elsewhere))
    assert code == 0 and "3 of 3 files fetched" in err
    code, out, err = cli("download", run_id, "-c", "dl")
    assert "2 of 3 files fetched" in err and (tmp_path / run_id / "metrics.json").read_text() == '{"step": 3}'
    assert cli("down", "-c", "dl", "--yes")[0] == 0                   # down, store kept: still fetchable
    code, out, err = cli("download", run_id, "-c", "dl", "-o", str(tmp_path / "after"))
    assert code == 0 and (tmp_path / "after" / "new.txt").read_text() == "more"


def test_download_from_a_bucket(cloud, cli, tmp_path):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    from google.cloud import storage
    bucket = storage.Client(project=PROJECT).bucket(f"{PROJECT}-tpuctl-bert")
    run_id = "20261122-120000-abcd"
    bucket.blob(layout.run_job(run_id)).upload_from_string(json.dumps(
        {"id": run_id, "name": "j", "command": "x", "package": "0" * 64}))
    bucket.blob(layout.run_index(runindex.flip(run_id))).upload_from_string(run_id)   # as submit indexes it
    for name, data in (("events/ev.1", b"e" * 5000), ("metrics.json", b"{}")):
        bucket.blob(f"{layout.run_output(run_id)}/{name}").upload_from_string(data)
    code, out, err = cli("download", "-c", "bert", "-o", str(tmp_path / "o"))
    assert code == 0 and "2 of 2 files fetched" in err, err
    assert (tmp_path / "o" / "events" / "ev.1").read_bytes() == b"e" * 5000
    code, out, err = cli("download", "-c", "bert", "-o", str(tmp_path / "o"))
    assert "0 of 2 files fetched" in err and "still going" in err     # no final status: the run may write more


class _OddNames:
    """A store whose listing holds a name that climbs out (GCS allows `..` in object names)."""
    def stats(self, prefix):
        return {prefix + "../../escaped": (1, "x")}

    def download_file(self, key, path, progress):
        raise AssertionError("must not be fetched")


def test_an_object_name_that_climbs_out_is_refused(env, tmp_path):
    with pytest.raises(TpuctlError, match="leaves the destination"):
        outputs(_OddNames(), "20261122-120000-abcd", tmp_path / "d", lambda total: (lambda n: None))
    assert not (tmp_path / "escaped").exists()


LISTING_JOB = """
import os, sys
out = os.environ["TPUCTL_OUTPUT_DIR"]
os.makedirs(out + "/ckpt", exist_ok=True)
open(out + "/ckpt/weights.bin", "wb").write(os.urandom(300_000))
print("here:", sorted(os.listdir(".")))
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
"""


def test_outputs_downloaded_into_the_job_directory_are_never_packed(local, cli, tmp_path, monkeypatch):
    """Issue 52: `download` run in the job directory writes ./RUN_ID/ there, and the next `submit` shipped it back
    (a checkpoint directory on every submit; the job found its old outputs in its working directory)."""
    from tpuctl.core import packaging
    job = make_job(tmp_path, LISTING_JOB)
    code, out, err = cli("submit", str(job), "-c", "dl")
    assert code == 0 and "here: ['main.py', 'tpuctl.toml']" in out, err
    run_id = json.loads(cli("jobs", "-c", "dl", "--json")[1])[0]["id"]
    monkeypatch.chdir(job)
    assert cli("download", "-c", "dl")[0] == 0
    assert (job / run_id / "ckpt" / "weights.bin").stat().st_size == 300_000
    (job / "notes.txt").write_text("mine")                           # the user's own new file is still packed
    assert packaging.files(job) == ["main.py", "notes.txt", "tpuctl.toml"]
    code, out, err = cli("submit", str(job), "-c", "dl")
    assert code == 0 and "here: ['main.py', 'notes.txt', 'tpuctl.toml']" in out, err
    said = [line for line in err.splitlines() if "left out of the package" in line]
    assert len(said) == 1 and f"1 file (300.0 kB) in {run_id}/" in said[0] and ".tpuctlignore" in said[0], err
    code, out, err = cli("submit", str(job), "-c", "dl", "--dry-run")   # the dry run says it too, and counts it out
    assert "left out of the package" in err and "package  " in out and "kB of files" not in out, out
    (job / ".tpuctlignore").write_text(f"{run_id}/\n")                 # listed by the user: left out, silently
    code, out, err = cli("submit", str(job), "-c", "dl", "--dry-run")
    assert code == 0 and "left out" not in err, err
    (job / ".tpuctlignore").unlink()
    assert cli("download", run_id, "-c", "dl", "-o", ".")[0] == 0        # into the job directory itself
    assert packaging.files(job) == ["main.py", "notes.txt", "tpuctl.toml"]   # the job's own files still packed
    assert [(d.directory, d.files) for d in packaging.left_out(job)] == [(".", 1), (run_id, 1)]


def test_a_download_stopped_half_way_is_recognised_too(tmp_path):
    """The marker is written before the first byte: a Ctrl-C mid-download leaves files a submit must not pack."""
    from tpuctl.core import packaging
    from tpuctl.core.store import LocalStore, partial_name

    store = LocalStore(str(tmp_path / "store"))
    run_id = "20261122-120000-abcd"
    for name in ("a.bin", "sub/b.bin"):
        store.write(f"{layout.run_output(run_id)}/{name}", b"x" * 1000)

    class Stops:
        def __getattr__(self, name):
            return getattr(store, name)

        def download_file(self, key, path, progress):
            open(os.path.join(os.path.dirname(path), partial_name()), "wb").write(b"half")
            raise KeyboardInterrupt

    job = make_job(tmp_path, "print(1)")
    with pytest.raises(KeyboardInterrupt):
        outputs(Stops(), run_id, job / "out", lambda total: (lambda n: None))
    assert packaging.files(job) == ["main.py", "tpuctl.toml"]
    (job / "out" / "sub").mkdir(exist_ok=True)
    (job / "out" / "sub" / "b.bin").write_bytes(b"y")                 # listed: left out wherever it is written
    (job / "out" / "mine.py").write_text("")                           # not a download's: packed
    assert packaging.files(job) == ["main.py", "out/mine.py", "tpuctl.toml"]
    (job / "out" / ".tpuctl-downloaded.json").write_text("{not json")   # a broken marker lists nothing
    assert "out/sub/b.bin" in packaging.files(job)


def test_the_last_line_says_whose_exit_code_it_is(local, cli, tmp_path):
    """Issue 52: the job's own 2 read as tpuctl's "bad input". The job's code is kept, the last line names it; a
    run that wrote no outputs is not offered a download."""
    code, out, err = cli("submit", str(make_job(tmp_path, "import sys; sys.exit(2)", name="argv")), "-c", "dl")
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("run ") and last.endswith(" failed (job exit code 2)"), err
    assert "tpuctl download" not in err and "outputs:" not in err
    code, out, err = cli("submit", str(make_job(tmp_path, LISTING_JOB, name="wrote")), "-c", "dl", "--", "3")
    assert code == 3 and err.strip().splitlines()[-1].endswith(" failed (job exit code 3)"), err
    assert "fetch them: tpuctl download" in err                       # a failed run with outputs still offers it
    rows = json.loads(cli("jobs", "-c", "dl", "--json")[1])           # what a script reads: the run's state
    assert [(r["state"], r["exit_code"]) for r in rows[:2]] == [("failed", 3), ("failed", 2)]


def test_a_store_that_cannot_list_the_outputs_still_ends_with_the_jobs_code(local, cli, tmp_path, monkeypatch):
    """The outputs check is one more request after the run ended: its failure costs the hint, never the code."""
    from tpuctl.core.errors import ErrorKind
    from tpuctl.core.store import LocalStore
    listing = LocalStore.list

    def flaky(self, prefix, limit=None):
        if prefix.endswith("/output/"):
            raise TpuctlError(ErrorKind.ERROR, "503 from the store", "")
        return listing(self, prefix, limit)
    monkeypatch.setattr(LocalStore, "list", flaky)
    code, out, err = cli("submit", str(make_job(tmp_path, "import sys; sys.exit(4)")), "-c", "dl")
    assert code == 4 and err.strip().splitlines()[-1].endswith(" failed (job exit code 4)"), err
    assert "internal error" not in err and "503" not in err


def test_downloads_into_one_directory_at_once_keep_each_others_files(tmp_path):
    """Two downloads into one directory at once (two runs, or a download beside a tensorboard sync): each adds its
    files to the marker under a lock, and neither's are lost to the other's rewrite."""
    from concurrent.futures import ThreadPoolExecutor

    from tpuctl.core import downloaded, packaging

    def fetch(i):
        for j in range(20):
            downloaded.record(tmp_path, f"run{i}", [f"r{i}/f{j}"])
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(fetch, range(4)))
    assert downloaded.listed(tmp_path) == {f"r{i}/f{j}" for i in range(4) for j in range(20)}
    (tmp_path / "r0").mkdir()
    (tmp_path / "r0" / "f3").write_text("x")
    (tmp_path / "code.py").write_text("")
    assert packaging.files(tmp_path) == ["code.py"]   # neither the outputs nor the marker and its lock are packed


def test_links_in_a_runs_outputs_that_lead_out_of_the_store_are_neither_listed_nor_fetched(tmp_path):
    """Issue 58.5: a job's outputs holding a link to a file outside the store were listed with the target's size,
    and `download` failed on them (the store refuses a key that leads out of it). A link to a file of the store
    itself is an output like any other; one that leads out, or nowhere, is none."""
    from tpuctl.core.store import LocalStore
    store = LocalStore(str(tmp_path / "store"))
    run_id = "20261122-120000-abcd"
    out = f"{layout.run_output(run_id)}"
    store.write(out + "/model.bin", b"m" * 1000)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 5000)
    base = store.root / out
    os.symlink(secret, base / "out-link")
    os.symlink(base / "model.bin", base / "latest")
    os.symlink(tmp_path / "missing", base / "dangling")
    assert store.list(out + "/") == [(out + "/latest", 1000), (out + "/model.bin", 1000)]
    got = outputs(store, run_id, tmp_path / "d", lambda total: (lambda n: None))
    assert got.files == 2 and [f for f in sorted(os.listdir(tmp_path / "d")) if not f.startswith(".")] == \
        ["latest", "model.bin"]
    assert (tmp_path / "d" / "latest").read_bytes() == b"m" * 1000
