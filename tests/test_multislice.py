"""Multislice (`up --slices N`, issue 31) against the fake TPU API: one queued resource with multislice_params, its
nodes named <prefix>-0..N-1, the price times N, status/ls/down over every slice, refusals before anything is made;
then one run across 2 slices x 2 hosts with MEGASCALE_* on every host."""
import json

import pytest
from conftest import PROJECT

from tpuctl.core import multislice

ZONE = "us-central2-b"
QR = f"projects/{PROJECT}/locations/{ZONE}/queuedResources/tpuctl-ms-qr"
NODES = [f"projects/{PROJECT}/locations/{ZONE}/nodes/tpuctl-ms-{k}" for k in range(2)]


@pytest.mark.usefixtures("no_leak")
def test_up_slices_makes_one_multislice_request_and_down_removes_every_slice(cloud, cli):
    code, out, err = cli("up", "--type", "v4-16", "--zone", ZONE, "--slices", "2", "-c", "ms", "--framework", "jax",
                         "--yes")
    assert code == 0, err
    assert "$51.52/hour (2 slices at $25.76)" in err               # v4-16: 8 chips x $3.22, twice
    creates = [c for c in cloud.tpu.calls if c[1] == "CreateQueuedResource"]
    assert len(creates) == 1 and [c for c in cloud.tpu.calls if c[1] == "CreateNode"] == []
    spec = cloud.tpu.queued[QR]["qr"].tpu.node_spec[0]
    assert spec.multislice_params.node_count == 2 and spec.multislice_params.node_id_prefix == "tpuctl-ms"
    assert spec.node_id == ""                                       # the oneof's other member
    assert sorted(cloud.tpu.nodes[2]) == NODES
    assert all(cloud.tpu.nodes[2][n].multislice_node for n in NODES)
    assert len(cloud.tpu.nodes[2][NODES[1]].network_endpoints) == 2   # v4-16: 2 hosts in each slice

    info = json.loads(cli("status", "-c", "ms", "--json")[1])
    assert info["resources"]["tpu slice 0"]["name"] == "tpuctl-ms-0"
    assert info["resources"]["tpu slice 1"]["state"] == "READY"
    from google.cloud import storage
    record = json.loads(storage.Client(project=PROJECT).bucket(f"{PROJECT}-tpuctl-ms").blob(
        "tpuctl/cluster.json").download_as_text())
    assert record["slices"] == 2 and record["hosts"] == 2 and record["coordinator"] == "10.1.0.1"
    rows = json.loads(cli("ls", "--json")[1])
    assert not [r for r in rows if r["orphan"]]                     # both slices are the cluster's own

    cloud.tpu.set_state(2, NODES[1], "PREEMPTED")                    # one slice lost: the cluster is
    info = json.loads(cli("status", "-c", "ms", "--json")[1])
    assert info["resources"]["tpu slice 1"]["state"] == "PREEMPTED"
    code, out, err = cli("up", "-c", "ms", "--yes")                 # asked for again, whole
    assert code == 0, err
    assert "tpuctl-ms-1 PREEMPTED: asking again" in err
    assert [cloud.tpu.nodes[2][n].state.name for n in NODES] == ["READY", "READY"]

    code, out, err = cli("down", "-c", "ms", "--yes")
    assert code == 0, err
    assert cloud.tpu.queued == {} and cloud.tpu.nodes[2] == {}


@pytest.mark.parametrize("flags, said", [
    (["--type", "v3-32", "--zone", "europe-west4-a"], "Multislice needs TPU v4 or newer; v3-32 is v3"),
    (["--type", "v2-32", "--zone", "us-central1-a"], "Multislice needs TPU v4 or newer"),
    (["--type", "v3-8", "--zone", "us-central1-b", "--arch", "node"], "a TPU Node (--arch node) cannot be part"),
])
def test_a_type_multislice_does_not_serve_is_refused_before_anything_is_made(cloud, cli, flags, said):
    code, out, err = cli("up", *flags, "--slices", "2", "-c", "old", "--yes")
    assert code == 2 and said in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2                      # the message and its hint
    assert cloud.tpu.mutating_calls() == [] and not [c for c in cloud.gcs.calls if not c.startswith("GET")]


def test_one_slice_is_not_a_multislice(cloud, cli):
    code, out, err = cli("up", "--type", "v4-16", "--zone", ZONE, "--slices", "1", "-c", "one", "--yes")
    assert code == 2 and "at least 2 slices" in err and cloud.tpu.mutating_calls() == []


def test_the_local_provider_refuses_slices(env, cli):
    code, out, err = cli("up", "--provider", "local", "-c", "l", "--slices", "2")
    assert code == 2 and "--slices" in err


def test_megascale_environment():
    record = {"slices": 2, "hosts": 2, "coordinator": "10.1.0.1"}
    assert multislice.environment(record, 1) == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.1.0.1:8081", "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": "8081"}
    assert multislice.environment({"hosts": 2}, 0) == {}
    assert multislice.node_names("tpuctl-x", 3) == ["tpuctl-x-0", "tpuctl-x-1", "tpuctl-x-2"]
    assert multislice.node_names("tpuctl-x", 1) == ["tpuctl-x"]
