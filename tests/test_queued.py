"""Queued resources (`up --queued`, issue 12) against the fake TPU API's queued-resource state machine: every state
shown while waiting, failover on FAILED, expiry (--valid-until), adoption on re-run, deletion with force, a
preempted spot request asked for again with its run resumed, and the host deleting its own request."""
import json
import time

import pytest
from conftest import PROJECT, until

from jobs import make_job
from tpuctl.core import runs, state

pytestmark = pytest.mark.usefixtures("no_leak")   # every test ends with nothing of tpuctl left

ZONE = "us-central1-a"
QR = f"projects/{PROJECT}/locations/{ZONE}/queuedResources/tpuctl-q-qr"
NODE = f"projects/{PROJECT}/locations/{ZONE}/nodes/tpuctl-q"


def _qr_state(cloud, name=QR):
    from google.cloud import tpu_v2
    q = cloud.tpu.queued.get(name)
    return tpu_v2.QueuedResourceState.State(q["qr"].state.state).name if q else None


def _calls(cloud, method):
    return [c for c in cloud.tpu.calls if c[1] == method]


def test_a_request_goes_through_every_state_and_down_deletes_it_with_its_tpu(cloud, cli):
    cloud.tpu.qr_step = 0.3
    code, out, err = cli("up", "--type", "v5litepod-8", "--zone", ZONE, "-c", "q", "--queued", "--yes")
    assert code == 0, err
    for shown in ("ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING"):
        assert shown in err, err
    assert _qr_state(cloud) == "ACTIVE" and NODE in cloud.tpu.nodes[2]
    assert cloud.tpu.nodes[2][NODE].queued_resource == QR
    labels = dict(cloud.tpu.queued[QR]["qr"].tpu.node_spec[0].node.labels)
    assert labels["tpuctl-cluster"] == "q"
    assert json.loads(cli("status", "-c", "q", "--json")[1])["resources"]["queued"] == {"state": "ACTIVE"}
    rows = json.loads(cli("ls", "--json")[1])
    assert not [r for r in rows if r["orphan"]]                  # its own request is no orphan

    assert cli("up", "-c", "q")[0] == 0                          # a re-run adopts the ACTIVE request
    assert len(_calls(cloud, "CreateQueuedResource")) == 1

    code, out, err = cli("down", "-c", "q", "--yes")
    assert code == 0, err
    assert cloud.tpu.queued == {} and cloud.tpu.nodes[2] == {}   # the request, and its TPU with it
    assert [c[2] for c in _calls(cloud, "DeleteQueuedResource")] == [QR]


def test_a_failed_request_moves_to_the_next_zone_and_is_not_left_behind(cloud, cli):
    cloud.tpu.qr_plans[ZONE] = ["ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED"]
    code, out, err = cli("up", "--type", "v5litepod-8", "--zone", f"{ZONE},us-south1-a", "-c", "q", "--queued",
                         "--yes")
    assert code == 0, err
    assert "FAILED" in err and "trying us-south1-a" in err
    assert list(cloud.tpu.queued) == [QR.replace(ZONE, "us-south1-a")]   # the failed one was deleted
    assert state.load("q").zone == "us-south1-a"
    assert cli("down", "-c", "q", "--yes")[0] == 0 and cloud.tpu.queued == {}


def test_a_request_not_met_before_valid_until_expires_and_up_says_so(cloud, cli):
    cloud.tpu.qr_plan, cloud.tpu.qr_step = ["ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"], 5.0
    t = time.time()
    code, out, err = cli("up", "--type", "v5litepod-8", "--zone", ZONE, "-c", "q", "--queued", "--valid-until", "2s",
                         "--yes")
    assert code == 4 and "FAILED" in err and time.time() - t < 30, err
    assert cloud.tpu.queued == {} and cloud.tpu.nodes[2] == {}   # nothing left waiting in the queue


def test_flags_that_do_not_fit_are_refused_offline(cloud, cli):
    lite = ["--type", "v5litepod-8", "--zone", ZONE]
    for args, said in ((lite + ["--valid-until", "1h"], "--valid-until applies to queued"),
                       (["--type", "v2-8", "--zone", "us-central1-b", "--queued", "--arch", "node"], "cannot be queued"),
                       (lite + ["--queued", "--flex-start"], "--flex-start needs --api compute")):
        code, out, err = cli("up", "-c", "q", *args, "--yes")
        assert code == 2 and said in err, (args, err)
    assert cloud.mutating_calls() == []


def test_an_orphan_request_is_listed_and_removed_from_its_labels(cloud, cli):
    assert cli("up", "--type", "v5litepod-8", "--zone", ZONE, "-c", "q", "--queued", "--yes")[0] == 0
    state.remove("q")                                            # the laptop that made it is gone
    rows = [r for r in json.loads(cli("ls", "--json", "--project", PROJECT)[1]) if r["kind"] == "queued"]
    assert rows and rows[0]["orphan"] and rows[0]["remove"] == f"tpuctl down -c q --project {PROJECT}"
    code, out, err = cli("down", "-c", "q", "--project", PROJECT, "--yes")
    assert code == 0, err
    assert cloud.tpu.queued == {} and cloud.tpu.nodes[2] == {}


def test_a_preempted_spot_request_is_asked_again_and_its_run_resumes(live_hosts, cloud, cli, tmp_path, monkeypatch):
    live_hosts.env["TPUCTL_STALE_SECONDS"] = "3"   # the preempted host's run is taken over soon after
    monkeypatch.setenv("TPUCTL_STALE_SECONDS", "3")
    assert cli("up", "--type", "v5litepod-8", "--zone", ZONE, "-c", "q", "--queued", "--spot", "--yes")[0] == 0
    assert cloud.tpu.queued[QR]["qr"].spot is not None and "spot" in cloud.tpu.queued[QR]["qr"]
    job = make_job(tmp_path, "import time\nprint('working', flush=True)\ntime.sleep(4)\nprint('done')")
    run_id = cli("submit", str(job), "-c", "q", "--detach")[1].strip()
    from tpuctl.providers.stores import open_store
    store = open_store(f"gs://{PROJECT}-tpuctl-q")
    until(lambda: runs.status(store, run_id, 0).state is runs.RunState.RUNNING, 60, "the run running")
    cloud.tpu.suspend(QR)                                        # Google reclaims the spot capacity
    code, out, err = cli("up", "-c", "q")
    assert code == 0 and "SUSPENDED: asking again" in err, err
    assert len(_calls(cloud, "CreateQueuedResource")) == 2
    code, out, err = cli("logs", run_id, "-c", "q", "--follow", "--give-up-after", "60")
    st = runs.status(store, run_id, 0)
    assert st.state is runs.RunState.SUCCEEDED and st.attempt == 2, out + err
    assert "done" in out
    assert cli("down", "-c", "q", "--yes")[0] == 0 and cloud.tpu.queued == {}


def test_the_host_of_a_queued_tpu_deletes_its_request_when_autostop_fires(live_hosts, cloud, cli):
    code, out, err = cli("up", "--type", "v5litepod-8", "--zone", ZONE, "-c", "q", "--queued", "--autostop", "3s",
                         "--yes")
    assert code == 0 and "armed: enforced by the host" in err, err
    until(lambda: cloud.tpu.queued == {} and cloud.tpu.nodes[2] == {}, 60, "the request and its TPU deleted")
    asked = [(m, p) for m, p, who in cloud.tpu.rest_calls]
    assert asked[0] == ("DELETE", f"/v2/{QR}?force=true")
    assert json.loads(cli("status", "-c", "q", "--json")[1])["phase"] == "stopped"


def test_two_ups_racing_on_one_request_never_delete_each_others(cloud, cli):
    """Another machine's `up` of the same cluster makes the request first (this `up` meets ALREADY_EXISTS); the
    request then FAILS. This `up` adopted it under the other's nonce, so it moves on without deleting it: the request
    (and whatever TPU it brings) is the other machine's to clean up."""
    from google.cloud import tpu_v2
    cloud.tpu.qr_plans[ZONE] = ["ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED"]

    def other_machine_requests_first():
        cloud.foreign.add(f"queued resource {QR}")   # the other machine's `down` removes it
        parent = f"projects/{PROJECT}/locations/{ZONE}"
        node = tpu_v2.Node(accelerator_type="v5litepod-8", labels={"tpuctl-cluster": "q", "tpuctl-nonce": "0ther000"})
        cloud.tpu.create_qr(2, tpu_v2.CreateQueuedResourceRequest(
            parent=parent, queued_resource_id="tpuctl-q-qr", queued_resource=tpu_v2.QueuedResource(
                tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
                    parent=parent, node_id="tpuctl-q", node=node)]))), None)
    cloud.tpu.before["CreateQueuedResource"].append(other_machine_requests_first)
    code, out, err = cli("up", "--type", "v5litepod-8", "--zone", ZONE, "-c", "q", "--queued", "--yes")
    assert "requested by another `up` of cluster q (its nonce 0ther000)" in err, err
    assert code == 4 and "FAILED" in err, err
    assert QR in cloud.tpu.queued and _qr_state(cloud) == "FAILED"   # left for the machine that made it
    assert _calls(cloud, "DeleteQueuedResource") == []
