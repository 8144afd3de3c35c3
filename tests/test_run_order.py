"""Runs in submission order (ids that sort as they were made, on one machine across processes), the agent's queue
first-in first-out, `logs` following the latest, `jobs` newest first, and the indexes that keep every command's
reads independent of how many runs the store holds (core/runindex.py)."""
import json
import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import until
from jobs import make_job, submit_to_store
from tpuctl.core import layout, runindex, runs
from tpuctl.core.runs import RunSpec, RunState, RunStatus
from tpuctl.core.store import LocalStore

PRINTS_ITS_ID = "import os\nprint('run', os.environ['TPUCTL_RUN_ID'], flush=True)\n"


def _burst(store_root, job_dir, n, lock, order):
    store = LocalStore(store_root)
    for _ in range(n):
        with lock:   # the submission order: each id is made and noted as one step
            order.append(submit_to_store(store, job_dir))


def test_same_second_bursts_from_two_processes_run_list_and_follow_in_submission_order(local_up, cli, tmp_path):
    st = local_up("order")
    job = make_job(tmp_path, PRINTS_ITS_ID)
    ctx = multiprocessing.get_context("fork")
    lock, order = ctx.Lock(), ctx.Manager().list()
    began = time.time()
    procs = [ctx.Process(target=_burst, args=(st.spec.store, job, 6, lock, order)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    submitted = list(order)
    assert len(submitted) == 12 and time.time() - began < 5
    assert submitted == sorted(submitted) and len({i[:15] for i in submitted}) <= 3   # ids made within seconds
    store = LocalStore(st.spec.store)
    until(lambda: all(runs.status(store, r).state.final for r in submitted), 120, "the agent to run the burst",
          every=0.2)
    started = sorted(submitted, key=lambda r: runs.status(store, r).started)
    assert started == submitted                              # first in, first out
    code, out, _ = cli("logs", "-c", "order")
    assert code == 0 and out.strip() == f"run {submitted[-1]}"   # the latest submitted
    rows = json.loads(cli("jobs", "-c", "order", "--json")[1])
    assert [r["id"] for r in rows] == submitted[::-1]        # newest first
    assert store.list(layout.QUEUE_PREFIX) == []             # every run settled off the queue


def test_ids_made_in_the_same_millisecond_or_after_a_clock_step_back_still_sort_in_order(env):
    stamps = [1_700_000_000.0005] * 5 + [1_699_999_999.0]   # the clock stands still, then steps back a second
    ids = [runs.new_id(now=lambda t=t: t) for t in stamps]
    assert ids == sorted(ids) and len(set(ids)) == 6
    assert all(runs.check_id(i) for i in ids)
    assert runs.check_id("20261122-174500-3f2a")             # ids of earlier releases stay valid


def test_pairs_submitted_within_a_second_logs_follows_the_later(local_up, cli, tmp_path):
    local_up("pairs")
    job = make_job(tmp_path, PRINTS_ITS_ID)
    for _ in range(3):
        first = cli("submit", str(job), "-c", "pairs", "--detach")[1].strip()
        second = cli("submit", str(job), "-c", "pairs", "--detach")[1].strip()
        assert second > first
        assert cli("logs", "-c", "pairs", "--follow")[1].strip() == f"run {second}"


def _plant(store, run_id, state=RunState.SUCCEEDED, framework="tensorflow", worker_states=()):
    store.write(layout.run_job(run_id), json.dumps(RunSpec(id=run_id, name="old", command="true", package="x",
                                                           framework=framework).to_json()).encode())
    store.write(layout.run_status(run_id, 0), json.dumps(RunStatus(state=state, started=1.0).to_json()).encode())
    for w, s in enumerate(worker_states, start=1):
        store.write(layout.run_status(run_id, w), json.dumps(RunStatus(state=s).to_json()).encode())


def test_a_store_from_before_the_index_is_indexed_once_and_its_queued_run_still_runs(local_up, cli, tmp_path):
    st = local_up("legacy")
    store = LocalStore(st.spec.store)
    old = [f"20261101-1200{s:02d}-00{s:02d}" for s in range(5)]   # ids of an earlier release, no milliseconds
    for rid in old:
        _plant(store, rid)
    waiting = submit_to_store(store, make_job(tmp_path, PRINTS_ITS_ID))
    for key in [k for k, _ in store.list("tpuctl/index/") + store.list(layout.QUEUE_PREFIX)]:
        store.delete(key)                                     # as a store written before the index existed
    rows = json.loads(cli("jobs", "-c", "legacy", "--json")[1])
    assert [r["id"] for r in rows] == [waiting, *old[::-1]]
    assert store.read(layout.RUN_INDEX_COMPLETE) == b"6"
    code, out, _ = cli("logs", "-c", "legacy", "--follow")    # the agent finds it on the rebuilt queue
    assert code == 0 and out.strip() == f"run {waiting}"
    # the agent settles the queue entry just after the final status the follower returned on (host/agent.py)
    queue = lambda: store.list(layout.QUEUE_PREFIX)  # noqa: E731
    until(lambda: queue() == [], 30, lambda: f"an empty queue, not {queue()}")


def test_the_index_is_rebuilt_when_lost_and_queues_what_is_unfinished(tmp_path):
    store = LocalStore(tmp_path / "s")
    _plant(store, "20261101-120000-aaaa")
    _plant(store, "20261101-120001-bbbb", RunState.QUEUED)
    assert runindex.newest(store) == ["20261101-120001-bbbb", "20261101-120000-aaaa"]
    assert runindex.queued(store) == ["20261101-120001-bbbb"]
    for key, _ in store.list("tpuctl/"):
        if key.startswith(("tpuctl/index/", layout.QUEUE_PREFIX)):
            store.delete(key)
    assert runindex.latest(store) == "20261101-120001-bbbb" and runindex.unfinished(store) == ["20261101-120001-bbbb"]


def test_a_slice_run_leaves_the_queue_only_when_every_worker_that_runs_it_is_final(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.write(layout.CLUSTER_RECORD, json.dumps({"hosts": 2}).encode())
    jax, tf = "20261101-120000-000-aaaa", "20261101-120000-001-bbbb"
    _plant(store, jax, framework="jax", worker_states=[RunState.RUNNING])
    _plant(store, tf, framework="tensorflow", worker_states=[RunState.QUEUED])   # worker 1 never runs it
    for rid in (jax, tf):
        runindex.register(store, rid)
    assert runindex.settle(store, jax) is False and runindex.settle(store, tf) is True
    assert runindex.queued(store) == [jax] and runindex.unfinished(store) == []
    store.write(layout.run_status(jax, 1), json.dumps(RunStatus(state=RunState.FAILED).to_json()).encode())
    assert runindex.settle(store, jax) and runindex.queued(store) == []


@pytest.mark.parametrize("record, workers_that_run_it", [
    ({"hosts": 2, "arch": "vm", "runtime": "tpu-vm-tf-2.18.0-pod-pjrt"}, 1),   # Keras on TensorFlow: worker 0
    ({"hosts": 2, "arch": "vm", "runtime": "v2-alpha-tpuv5"}, 2)])             # Keras on JAX: every host
def test_a_keras_run_leaves_the_queue_as_its_backend_runs_it(tmp_path, record, workers_that_run_it):
    store = LocalStore(tmp_path / "s")
    store.write(layout.CLUSTER_RECORD, json.dumps(record).encode())
    rid = "20261101-120000-000-cccc"
    _plant(store, rid, framework="keras", worker_states=[RunState.QUEUED])
    runindex.register(store, rid)
    assert runindex.settle(store, rid) is (workers_that_run_it == 1)


def test_the_local_store_lists_the_first_keys_in_key_order_without_the_rest(tmp_path):
    store = LocalStore(tmp_path / "s")
    # "ad-x" sorts before "ad/b" ('-' < '/') though the name "ad" sorts before "ad-x": a walk by names is wrong
    keys = ["a", "a-b/c", "a.z", "a0", "ab", "ad/b/c", "ad/x", "ad-x", "b/.x.tmp", "b/y"]
    for k in keys:
        store.write(k, b"1")
    want = sorted(k for k in keys if k != "b/.x.tmp")
    assert [k for k, _ in store.list("")] == want
    for n in range(len(want) + 1):
        assert [k for k, _ in store.list("", n)] == want[:n]
    assert [k for k, _ in store.list("a")] == [k for k in want if k.startswith("a")]
    assert [k for k, _ in store.list("ad/")] == ["ad/b/c", "ad/x"]
    assert [k for k, _ in store.list("ad/b", 1)] == ["ad/b/c"]
    store.delete("a0")
    store.delete("a0")                                        # absent: not an error
    assert "a0" not in [k for k, _ in store.list("")]


@pytest.fixture
def bucket_store(cloud):
    from tpuctl.providers.google.gcs_store import GcsStore
    from tpuctl.providers.google import clients
    from conftest import PROJECT
    clients.storage(PROJECT).create_bucket("history")
    return GcsStore("gs://history", PROJECT)


def test_on_gcs_the_latest_runs_are_one_short_page_whatever_the_history(bucket_store, cloud, monkeypatch):
    store = bucket_store
    # The emulator (in memory) rewrites its whole metadata file, every object's, at each write, a file only its
    # start-up reads (gcp_storage_emulator/storage.py `create_file` -> `_write_config_to_file`): 1,050 writes would
    # cost what the listing never shows. Its objects, and every answer, are the same without it.
    monkeypatch.setattr(cloud.gcs.emulator._storage, "_write_config_to_file", lambda: None)
    ids = [f"20261101-1200{s // 100 % 60:02d}-{s % 1000:03d}-{s:04x}" for s in range(1050)]
    bucket = store.bucket
    with ThreadPoolExecutor(8) as pool:                        # the index only: what the listing reads
        list(pool.map(lambda rid: bucket.blob(layout.run_index(runindex.flip(rid))).upload_from_string(rid), ids))
    bucket.blob(layout.RUN_INDEX_COMPLETE).upload_from_string(b"1050")
    bucket.blob(layout.run_job(max(ids))).upload_from_string(   # `logs` checks that the latest exists
        json.dumps(RunSpec(id=max(ids), name="j", command="true", package="p").to_json()))
    cloud.gcs.listed.clear()
    assert runindex.newest(store, 20) == sorted(ids, reverse=True)[:20]
    assert runindex.latest(store) == max(ids)
    assert cloud.gcs.listed == [20, 1]                       # one page each, never the 1,050
    cloud.gcs.listed.clear()
    assert runindex.all_ids(store) == sorted(ids)            # --all pages through, 1,000 at a time
    assert cloud.gcs.listed == [1000, 50]
    store.delete(layout.run_index(runindex.flip(ids[0])))
    store.delete(layout.run_index(runindex.flip(ids[0])))      # a retried delete whose first try applied
    assert len(runindex.all_ids(store)) == 1049


def test_index_and_queue_entries_that_name_no_run_are_dropped_and_reported_once(tmp_path, capsys):
    """Issue 28.6: entries planted by hand or left by a crash: a name that is no run id (shape, or an impossible
    date such as 99999999-999999-...), or a run id with no job.json. None shows in `jobs` or `logs`, none stays in
    the queue, each is reported once; the real run is listed and runs."""
    from tpuctl.control import submission
    from tpuctl.host.agent import Agent
    store = LocalStore(tmp_path / "s")
    real = submit_to_store(store, make_job(tmp_path, PRINTS_ITS_ID))
    planted = [layout.run_index(runindex.flip("99999999-999999-999-9999")),     # sorts first: newest-looking
               layout.run_index(runindex.flip("20991231-235959-999-ffff")),     # a run id, but no such run
               f"{layout.RUN_INDEX_PREFIX}zzzzzz/garbage",
               layout.queue_entry("99999999-999999-999-9999"), layout.queue_entry("20991231-235959-999-ffff"),
               layout.queue_entry("not-a-run")]
    for key in planted:
        store.write(key, b"x")
    said = []
    assert runindex.latest(store, said.append) == real
    assert [r["id"] for r in submission.table(store)] == [real]
    assert runindex.unfinished(store, said.append) == [real]
    assert runindex.newest(store, 1, said.append) == [real] and runindex.queued(store, report=said.append) == [real]
    assert sorted(k for k in planted if store.read(k) is not None) == []
    said += [m.removeprefix("tpuctl: ") for m in capsys.readouterr().err.splitlines()]   # `jobs` reports on stderr
    gone = [m.split(" from ")[0].removeprefix("removed ") for m in said]
    assert sorted(gone) == sorted(planted), said                    # each reported, once
    assert not store.list(layout.run_prefix("20991231-235959-999-ffff"))   # nothing written for a phantom
    store.write(layout.queue_entry("20991231-235959-999-ffff"), b"x")   # the agent meets one in its queue too
    agent = Agent(str(tmp_path / "s"), home=str(tmp_path / "agent"))
    assert agent.tick() and runs.status(store, real).state is RunState.SUCCEEDED
    assert not agent.tick()
    assert [k for k, _ in store.list(layout.QUEUE_PREFIX)] == []
