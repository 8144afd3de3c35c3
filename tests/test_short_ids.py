"""Run ids as people copy them (issue 30): `jobs` shows them whole at 80 columns, and every command that takes an
id takes a unique start or end of one, as git and docker take short ids; an ambiguous one names its candidates."""
import json
import re

import pytest
from rich.console import Console

from tpuctl.core import layout, runindex
from tpuctl.core.runs import RunSpec, RunState, RunStatus
from tpuctl.core.store import LocalStore
from tpuctl.control.submission import resolve_run
from tpuctl.core.errors import ErrorKind, TpuctlError

IDS = ["20261125-140831-123-3f2a",    # today's shape
       "20261125-140831-456-77aa",    # the same second: a prefix down to the second is ambiguous
       "20261124-093000-001-beef",
       "20251231-235959-3f2a"]        # an id of an earlier release, ending as the first one does


def plant(store, run_id, state=RunState.SUCCEEDED, name="bert_pretrain_with_a_long_name"):
    """A finished run, written and indexed as submit writes one."""
    store.write(layout.run_job(run_id), json.dumps(RunSpec(id=run_id, name=name, command="true",
                                                           package="x").to_json()).encode())
    store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(state=state, started=1.0, ended=61.0,
                                                                   exit_code=0).to_json()).encode())
    store.create(layout.run_index(runindex.flip(run_id)), run_id.encode())
    store.write(layout.run_metrics(run_id), json.dumps({
        "step": 1000, "metrics": {"loss": 0.0612345},
        "history": {"loss": [[s, 9.0 - s / 200] for s in range(0, 1001, 100)]},
        "attempts": [{"start": 1.0, "from": 0, "step": 1000, "last": 61.0, "step_seconds": 50.0}]}).encode())


class CountingStore(LocalStore):
    def __init__(self, root):
        super().__init__(root)
        self.listed = []

    def list(self, prefix, limit=None):
        self.listed.append(prefix)
        return super().list(prefix, limit)


@pytest.fixture
def store(tmp_path):
    s = CountingStore(str(tmp_path / "store"))
    s.write(layout.RUN_INDEX_COMPLETE, b"0")
    for rid in IDS:
        plant(s, rid)
    return s


@pytest.mark.parametrize("given,expect", [
    ("20261124", "20261124-093000-001-beef"),            # a start
    ("20261125-140831-4", "20261125-140831-456-77aa"),
    ("77aa", "20261125-140831-456-77aa"),                # the end `jobs` users copy
    ("BEEF", "20261124-093000-001-beef"),                # hex in capitals, as a terminal font may suggest
    ("123-3f2a", "20261125-140831-123-3f2a"),
    ("20251231", "20251231-235959-3f2a"),                # an earlier release's id, by its start
])
def test_a_unique_start_or_end_names_the_run(store, given, expect):
    assert resolve_run(store, given) == expect


@pytest.mark.parametrize("given,candidates", [
    ("3f2a", ["20261125-140831-123-3f2a", "20251231-235959-3f2a"]),
    ("20261125-140831", ["20261125-140831-456-77aa", "20261125-140831-123-3f2a"]),
])
def test_an_ambiguous_short_id_names_each_candidate_in_one_line(store, given, candidates):
    with pytest.raises(TpuctlError) as e:
        resolve_run(store, given)
    assert e.value.kind is ErrorKind.INPUT and "\n" not in e.value.message
    assert f"{len(candidates)} runs match ({', '.join(candidates)})" in e.value.message
    assert "give more of the id" in e.value.hint


def test_a_whole_id_is_one_read_no_listing_and_a_start_lists_only_its_own_keys(store):
    assert resolve_run(store, IDS[0]) == IDS[0]
    assert store.listed == []                                  # never the index, whatever the store's history
    assert resolve_run(store, "20261124-09") == IDS[2]
    assert store.listed == [layout.run_index(runindex.flip("20261124-09"))]   # a start cannot be an end: one listing


@pytest.mark.parametrize("given,kind,said", [
    ("nope", ErrorKind.INPUT, "is not a run id"),
    ("3f2", ErrorKind.INPUT, "is not a run id"),                   # shorter than 4: would match too much
    ("../../x", ErrorKind.INPUT, "is not a run id"),
    ("2026-11-25", ErrorKind.INPUT, "is not a run id"),            # neither the start nor the end of any id
    ("dead", ErrorKind.NOT_FOUND, "no run id starts or ends with 'dead'"),
    ("20261125-140831-999-0000", ErrorKind.NOT_FOUND, "no run 20261125-140831-999-0000"),
])
def test_what_names_no_run_is_refused_with_a_hint(store, given, kind, said):
    with pytest.raises(TpuctlError) as e:
        resolve_run(store, given)
    assert e.value.kind is kind and said in e.value.message and e.value.hint


def test_jobs_at_80_columns_shows_whole_ids_and_logs_download_cancel_take_the_short_form(local_up, cli, monkeypatch,
                                                                                      tmp_path):
    from tpuctl.cli import console
    st = local_up("short")
    store = LocalStore(st.spec.store)
    for rid in IDS[:3]:
        plant(store, rid)
        store.write(layout.log_chunk(rid, 0, 1), f"log of {rid}\n".encode())
    monkeypatch.setattr(console, "out", Console(force_terminal=True, width=80, highlight=False, soft_wrap=True))
    code, out, err = cli("jobs", "-c", "short")
    assert code == 0, err
    lines = re.sub(r"\x1b\[[0-9;]*m", "", out).splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines)
    assert all(any(rid in line for line in lines) for rid in IDS[:3]), out   # each id whole, on one line
    assert "(too narrow for loss curve, " in err
    code, out, err = cli("logs", "77aa", "-c", "short")
    assert code == 0 and out == f"log of {IDS[1]}\n", err
    plant(store, "20261126-100000-000-c0de", state=RunState.RUNNING)
    code, out, err = cli("cancel", "c0de", "-c", "short")
    assert code == 0 and "cancel of run 20261126-100000-000-c0de requested" in err, err
    assert store.read(layout.run_cancel("20261126-100000-000-c0de")) is not None
    code, out, err = cli("logs", "20261125-140831", "-c", "short")
    assert code == 2 and "is ambiguous: 2 runs match" in err and "hint:" in err
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("download", "beef", "-c", "short")
    assert code == 0 and "20261124-093000-001-beef/: 1 of 1 files fetched" in err, err


@pytest.mark.parametrize("blank", ["", "   "])
def test_an_empty_run_id_is_a_usage_error_for_every_command_never_the_latest_run(local_up, cli, blank):
    """`tpuctl cancel "$RUN"` with RUN unset in a script (issue 38): exit 2, and the latest run is left alone."""
    st = local_up("blank")
    store = LocalStore(st.spec.store)
    plant(store, "20261126-100000-000-c0de", state=RunState.RUNNING)
    store.write(layout.log_chunk("20261126-100000-000-c0de", 0, 1), b"log of the latest\n")
    for args in (["cancel", blank], ["logs", blank], ["download", blank], ["tensorboard", blank]):
        code, out, err = cli(*args, "-c", "blank")
        assert code == 2 and "empty run id" in err and "hint:" in err and "Traceback" not in err, (args, err)
        assert "log of the latest" not in out
    assert store.read(layout.run_cancel("20261126-100000-000-c0de")) is None
    with pytest.raises(TpuctlError) as e:
        resolve_run(store, blank)
    assert e.value.kind is ErrorKind.INPUT
