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
