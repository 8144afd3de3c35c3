"""A run waiting behind another run on the same cluster is queued, not lost (issue 63, item 1): its follower says
which run it waits behind and never gives up on the host for that."""
import threading

from jobs import make_job

WAIT_FOR_GO = """
import os, time
go = {go!r}
while not os.path.exists(go):
    time.sleep(0.1)
print("first done")
"""


def test_a_run_queued_behind_another_is_followed_until_it_runs(local_up, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "1.5")   # a silent host would be given up on within 3 s
    local_up("q1")
    go_file = tmp_path / "go"
    first = make_job(tmp_path / "a", WAIT_FOR_GO.format(go=str(go_file)), name="first")
    code, out, err = cli("submit", str(first), "-c", "q1", "--detach")
    assert code == 0, err
    first_id = out.strip()
    go = threading.Timer(6.0, lambda: go_file.write_text("go"))
    go.start()
    try:
        code, out, err = cli("submit", str(make_job(tmp_path / "b", "print('second done')\n", name="second")),
                             "-c", "q1", "--give-up-after", "1")
    finally:
        go.cancel()
    flat = " ".join(err.split())
    assert code == 0 and out == "second done\n", err
    assert f"queued behind run {first_id} (running) on cluster q1; it starts when that one ends" in flat, err
    assert "no word from its host" not in flat and "still queued" not in flat


def test_the_wait_names_the_step_of_the_run_ahead_and_ignores_a_silent_one(tmp_path):
    """The run ahead is named with its step (metrics.json); a run ahead whose status has gone stale is no reason to
    wait: the usual silence rules apply to it."""
    import json
    import time
    from tpuctl.control.hostwatch import HostWatch
    from tpuctl.core import layout, runindex, runs
    from tpuctl.core.models import ClusterSpec, ClusterState, ProviderName
    from tpuctl.core.store import LocalStore
    store = LocalStore(str(tmp_path / "store"))
    ahead, mine = "20261101-120000-000-aaaa", "20261101-120001-000-bbbb"
    for rid in (ahead, mine):
        runindex.register(store, rid)
    store.write(layout.run_metrics(ahead), json.dumps({"step": 120, "metrics": {"loss": 7.5}}).encode())

    class Prov:
        def revive(self, st, reporter):
            return st

        def store(self, st):
            return store

        def host_state(self, st):
            return True, "the agent is running"
    said = []
    watch = HostWatch(Prov(), ClusterState(spec=ClusterSpec(name="c1", provider=ProviderName.LOCAL, store="/x")),
                      mine, 900, said.append, reporter=None)
    store.write(layout.run_status(ahead, 0), json.dumps(runs.RunStatus(
        state=runs.RunState.RUNNING, heartbeat=time.time()).to_json()).encode())
    watch(runs.RunStatus())
    assert said == [f"run {mine} is queued behind run {ahead} (running, step 120) on cluster c1; it starts when that "
                    "one ends (a cluster runs one run at a time; to run both at once, submit to another cluster)"]
    store.write(layout.run_status(ahead, 0), json.dumps(runs.RunStatus(
        state=runs.RunState.RUNNING, heartbeat=time.time() - 1000).to_json()).encode())
    watch.behind = None
    watch(runs.RunStatus())
    assert len(said) == 1 and not watch.behind[1]
