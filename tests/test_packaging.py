"""Job packages, the local store's create-if-absent, and the data sync plan."""
import io
import tarfile

import pytest

from tpuctl.core import packaging, runs
from tpuctl.core.errors import TpuctlError
from tpuctl.core.store import LocalStore


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


@pytest.mark.parametrize("members", [
    [("/etc/evil", "file", "")],
    [("../evil", "file", "")],
    [("a/../../evil", "file", "")],
    [("link", "sym", "/etc/passwd")],
    [("link", "sym", "../../outside")],
])
def test_unpack_refuses_escapes(tmp_path, members):
    with pytest.raises(TpuctlError):
        packaging.unpack(_tar(members), tmp_path / "out")
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


def test_sync_plan_places_each_path_at_its_name(tmp_path):
    from tpuctl.core.datasync import plan
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "a.txt").write_text("a")
    (tmp_path / "f.txt").write_text("f")
    assert [k for _, k in plan([tmp_path / "d", tmp_path / "f.txt"], ["inputs/d", "f.txt"])] == [
        "inputs/d/sub/a.txt", "f.txt"]


def test_following_an_idle_run_costs_a_bounded_number_of_requests():
    """Two store reads per poll, polls spaced out to TPUCTL_LOG_POLL_MAX (1 s): a run silent for 10 minutes
    costs about 1,200 requests, not one per millisecond."""
    from tpuctl.core import runs

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


def _tar(members):
    """members: (name, kind, target_or_content) with kind file, sym, dir or chr (a device)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, kind, arg in members:
            info = tarfile.TarInfo(name)
            if kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, arg
                tar.addfile(info)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "chr":
                info.type = tarfile.CHRTYPE
                tar.addfile(info)
            else:
                data = (arg or "x").encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.mark.parametrize("members", [
    # each entry looks harmless checked against an empty directory; together they climb out
    [("a", "sym", "."), ("a/b", "sym", ".."), ("b/x", "file", "escaped")],
    [("d", "sym", "."), ("d/d2", "sym", "d"), ("e", "sym", "d2/.."), ("e/x", "file", "escaped")],
    [("up", "dir", ""), ("up/l", "sym", ".."), ("up/l/l2", "sym", ".."), ("up/l/l2/x", "file", "escaped")],
    [("dev", "chr", "")],
    [("a", "sym", "b"), ("b", "sym", "a"), ("a/x", "file", "looped")],          # a link loop, then through it
    [("a", "sym", "b"), ("b", "sym", "a"), ("a", "dir", "")],
    [("s", "sym", "s"), ("s/t/x", "file", "looped")],
])
def test_unpack_checks_each_entry_against_the_disk(tmp_path, members):
    out = tmp_path / "sandbox" / "out"
    with pytest.raises(TpuctlError) as e:
        packaging.unpack(_tar(members), out)
    assert "unsafe job package" in e.value.message
    assert not list((tmp_path / "sandbox").glob("x")) and not (tmp_path / "x").exists()


def test_a_job_directory_with_a_link_loop_is_refused_in_one_line(env, cli, tmp_path):
    from jobs import make_job
    job = make_job(tmp_path, "print(1)\n")
    (job / "a").symlink_to("b")
    (job / "b").symlink_to("a")
    code, out, err = cli("submit", str(job), "--dry-run")
    assert code == 2 and "unsafe job package: a is a link loop" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 2   # the error and its hint


def test_links_that_stay_inside_still_work(tmp_path):
    data = _tar([("pkg/m.py", "file", "x = 1"), ("lib", "sym", "pkg"), ("lib/n.py", "file", "y = 2"),
                 ("a", "sym", "."), ("a/top.txt", "file", "t")])
    packaging.unpack(data, tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "n.py").read_text() == "y = 2"
    assert (tmp_path / "out" / "top.txt").read_text() == "t"


def test_unpack_caps_entries_and_bytes(tmp_path):
    five = _tar([(f"f{i}", "file", "0123456789") for i in range(5)])
    with pytest.raises(TpuctlError, match="more than 3 entries"):
        packaging.unpack(five, tmp_path / "a", max_entries=3)
    with pytest.raises(TpuctlError, match="more than 25 bytes"):
        packaging.unpack(five, tmp_path / "b", max_bytes=25)
    assert sum(p.stat().st_size for p in (tmp_path / "b").iterdir()) <= 25   # stopped, not read whole first
    packaging.unpack(five, tmp_path / "c", max_bytes=50, max_entries=5)


def test_the_agent_refuses_a_package_that_does_not_match_its_name(tmp_path):
    import json
    from jobs import make_job
    from tpuctl.core import layout
    from tpuctl.host.agent import Agent
    store = LocalStore(tmp_path / "store")
    data, sha = packaging.build(make_job(tmp_path, "print('tampered')\n"))
    other = "0" * 64
    store.create(layout.job_package(other), data)    # someone else's bytes under a name they do not hash to
    store.create(layout.run_job("r1"), json.dumps(runs.RunSpec(id="r1", name="job", command="python main.py",
                                                               package=other).to_json()).encode())
    agent = Agent(str(tmp_path / "store"), home=str(tmp_path / "agent"))
    assert agent.execute("r1") == 127
    log = b"".join(store.read(k) or b"" for k, _ in store.list(layout.run_logs("r1", 0))).decode()
    assert "does not match its sha256 name" in log


def test_package_limits_come_from_the_environment_then_the_cluster_record(tmp_path, monkeypatch):
    from tpuctl.host.agent import Agent
    agent = Agent(str(tmp_path / "store"), home=str(tmp_path / "agent"))
    assert agent.package_limits() == (packaging.MAX_BYTES, packaging.MAX_ENTRIES)
    agent.record = {"max_package_bytes": 1000, "max_package_entries": 7}
    assert agent.package_limits() == (1000, 7)
    monkeypatch.setenv("TPUCTL_MAX_PACKAGE_BYTES", "5")
    assert agent.package_limits() == (5, 7)
