"""Job packages, the local store's create-if-absent, and the data sync plan."""
import io
import tarfile

import pytest

from tpuctl import packaging, runs
from tpuctl.errors import TpuctlError
from tpuctl.store import LocalStore


def _job(tmp_path):
    d = tmp_path / "job"
    (d / "pkg").mkdir(parents=True)
    (d / "tpuctl.toml").write_text('command = "python train.py"\n')
    (d / "train.py").write_text("print(1)\n")
    (d / "pkg" / "m.py").write_text("x = 1\n")
    (d / "__pycache__").mkdir()
    (d / "__pycache__" / "c.pyc").write_bytes(b"\0")
    (d / ".git").mkdir()
    (d / ".git" / "HEAD").write_text("ref")
    (d / "big.ckpt").write_text("skip me")
    (d / "data").mkdir()
    (d / "data" / "corpus.txt").write_text("synced separately")
    (d / ".tpuctlignore").write_text("# comment\n*.ckpt\n")
    return d


def test_package_is_deterministic_and_excludes(tmp_path):
    d = _job(tmp_path)
    data1, sha1 = packaging.build(d, [d / "data"])
    (d / "train.py").touch()  # a new mtime changes nothing
    data2, sha2 = packaging.build(d, [d / "data"])
    assert (data1, sha1) == (data2, sha2)
    names = tarfile.open(fileobj=io.BytesIO(data1)).getnames()
    assert names == [".tpuctlignore", "pkg/m.py", "tpuctl.toml", "train.py"]
    (d / "train.py").write_text("print(2)\n")
    assert packaging.build(d, [d / "data"])[1] != sha1


def test_unpack_round_trip(tmp_path):
    d = _job(tmp_path)
    data, _ = packaging.build(d, [d / "data"])
    packaging.unpack(data, tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "m.py").read_text() == "x = 1\n"


def _evil(members):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, kind, target in members:
            info = tarfile.TarInfo(name)
            if kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            else:
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
    return raw.getvalue()


@pytest.mark.parametrize("members", [
    [("/etc/evil", "file", "")],
    [("../evil", "file", "")],
    [("a/../../evil", "file", "")],
    [("link", "sym", "/etc/passwd")],
    [("link", "sym", "../../outside")],
])
def test_unpack_refuses_escapes(tmp_path, members):
    with pytest.raises(TpuctlError):
        packaging.unpack(_evil(members), tmp_path / "out")
    assert not (tmp_path / "evil").exists()


def test_local_store_create_if_absent(tmp_path):
    s = LocalStore(tmp_path / "store")
    assert s.create("tpuctl/runs/1/claim", b"a")
    assert not s.create("tpuctl/runs/1/claim", b"b")
    assert s.read("tpuctl/runs/1/claim") == b"a"
    s.write("x/y", b"1")
    s.write("x/y", b"2")
    assert s.read("x/y") == b"2" and s.read("nope") is None
    assert [k for k, _ in s.list("tpuctl/runs/")] == ["tpuctl/runs/1/claim"]
    with pytest.raises(ValueError):
        s.read("../outside")


def test_sync_plan_keeps_dir_names(tmp_path):
    from tpuctl.datasync import plan
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "a.txt").write_text("a")
    (tmp_path / "f.txt").write_text("f")
    assert [k for _, k in plan([tmp_path / "d", tmp_path / "f.txt"], "data/j/")] == ["data/j/d/sub/a.txt",
                                                                                       "data/j/f.txt"]


def test_following_an_idle_run_costs_a_bounded_number_of_requests():
    """Two store reads per poll, polls spaced out to TPUCTL_LOG_POLL_MAX (1 s): a run silent for 10 minutes
    costs about 1,200 requests, not one per millisecond."""
    from tpuctl import runs

    class CountingStore:
        def __init__(self):
            self.reads, self.now = 0, 0.0

        def read(self, key):
            self.reads += 1
            if key.endswith("status.json"):
                return b'{"state": "succeeded", "exit_code": 0}' if self.now >= 600 else b'{"state": "running"}'
            return None

    s = CountingStore()

    def sleep(dt):
        s.now += dt
    st = runs.follow(s, "r", lambda b: None, sleep=sleep, max_idle=1.0)
    assert st.state is runs.RunState.SUCCEEDED
    assert s.reads <= 2 * 600 + 20
