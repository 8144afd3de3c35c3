"""What a recovery says (issue 30): where the compute came back (never a blank zone), one measure of how long it took
(the watcher's log and `status` give the same number), and from which step each interrupted run resumed, or that it
began again from the start, never "from its checkpoint" for a run that had none."""
import json
import re
import time

from conftest import until
from test_watch import NODE, ZONE, Running, _up, fast  # noqa: F401 - fast is a fixture

from tpuctl.control import armed
from tpuctl.core import layout, runindex, runs
from tpuctl.core.runs import RunSpec, RunState, RunStatus
from tpuctl.core.store import LocalStore

RUN = "20261125-000000-000-abcd"


def _training(store, run_id, attempts):
    store.write(layout.run_metrics(run_id), json.dumps({
        "step": 30, "metrics": {"loss": 7.0}, "history": {"loss": [[30, 7.0]]},
        "attempts": [{"start": 1.0 + i, "from": f, "step": 30, "last": 2.0, "step_seconds": 1.0}
                     for i, f in enumerate(attempts)]}).encode())


def test_the_watcher_and_status_name_the_zone_one_duration_and_the_step_the_run_resumed_from(cloud, cli, fast,
                                                                                              no_leak):
    from tpuctl.core import state
    from tpuctl.providers import registry
    _up(cli)
    store = registry.get("gcp").store(state.load("w"))
    store.write(layout.run_job(RUN), json.dumps(RunSpec(id=RUN, name="bert", command="x", package="p").to_json())
                .encode())
    store.write(layout.run_status(RUN, 0), json.dumps(RunStatus(state=RunState.RUNNING, heartbeat=time.time() - 40)
                                                      .to_json()).encode())
    runindex.register(store, RUN)
    _training(store, RUN, [0])                                  # one attempt so far, from the start
    store.write(layout.agent_heartbeat("tpu-host", 0), json.dumps({"worker": 0, "time": time.time() - 40}).encode())
    w = Running()
    until(lambda: any("holding its lease" in m for m in w.said.lines), what="the lease")
    cloud.tpu.set_state(2, NODE, "PREEMPTED")
    until(lambda: any(m.startswith("recovery 1: cluster w: ") for m in w.said.lines), what="the recovery said")
    line = next(m for m in w.said.lines if m.startswith("recovery 1: cluster w: "))
    assert f"; back on v3-8 in {ZONE} after " in line
    took = int(re.search(r"after (\d+)s without compute", line).group(1))
    assert took >= 40                                           # from the last heartbeat, not from when it was seen
    assert f"its agent runs {RUN} again" in line and "from its checkpoint at step" not in line
    status = json.loads(cli("status", "-c", "w", "--json")[1])
    assert f"after {took}s without compute" in status["recoveries"][0]   # one measure everywhere
    assert "resumed" not in status["recoveries"][0]            # not yet: the new attempt has not begun training
    _training(store, RUN, [0, 20])                             # the new host's attempt restored step 20
    until(lambda: any(m == f"recovery 1: run {RUN} resumed from its checkpoint at step 20" for m in w.said.lines),
           what="the resumption said")
    status = json.loads(cli("status", "-c", "w", "--json")[1])
    assert status["recoveries"][0].endswith(f"; run {RUN} resumed from its checkpoint at step 20")
    store.write(layout.run_status(RUN, 0), json.dumps(RunStatus(state=RunState.SUCCEEDED).to_json()).encode())
    armed.for_run(store, RUN)
    assert w.wait() == f"run {RUN} ended (succeeded)"


def test_a_run_that_had_no_checkpoint_is_said_to_start_again_from_the_start(tmp_path):
    store = LocalStore(tmp_path / "s")
    _training(store, RUN, [0, 0])
    rec = {"lost": "the local agent (pid 7) is gone", "gone_seconds": 3.4, "zone": "", "where": "this machine",
           "runs": {RUN: 1}}
    assert armed.recovery_line(rec) == "the local agent (pid 7) is gone; back on this machine after 3s without compute"
    assert armed.resumption(store, rec) == f"run {RUN} resumed from the start"
    older = {"lost": "PREEMPTED", "gone_seconds": 42, "zone": ZONE}   # a record of an earlier release
    assert armed.recovery_line(older) == f"PREEMPTED; back in {ZONE} after 42s without compute"
    assert armed.resumption(store, older) == ""
    assert runs.is_id(RUN)
