"""`up` -> `status` -> `down` through the real CLI and the real google clients, against the wire-level fakes."""
import json

import pytest
from conftest import PROJECT

from tpuctl.core import state
from tpuctl.core.models import OBJECT_ROLES

pytestmark = pytest.mark.usefixtures("no_leak")   # every test ends with nothing of tpuctl left

STOCKOUT = 'There is no more capacity in the zone "us-central1-a"; you can try in another zone where Cloud TPU ' \
           'Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1234]'
DEFAULT_SA = "serviceAccount:424242-compute@developer.gserviceaccount.com"
BUCKET = f"{PROJECT}-tpuctl-bert"


def bucket_policy(cloud, bucket=BUCKET):
    from google.cloud import storage
    b = storage.Client(project=PROJECT).bucket(bucket)
    return {row["role"]: set(row["members"]) for row in b.get_iam_policy(requested_policy_version=3).bindings}


def bucket_doc(bucket=BUCKET):
    from google.cloud import storage
    return storage.Client(project=PROJECT).get_bucket(bucket)


def test_up_status_down_vm(cloud, cli):
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")
    assert code == 0, err
    assert "$8.00/hour" in err
    node = cloud.tpu.nodes[2][f"projects/{PROJECT}/locations/us-central1-b/nodes/tpuctl-bert"]
    assert node.state.name == "READY"
    assert node.accelerator_type == "v3-8"
    assert node.runtime_version == "v2-alpha-tpuv5"   # where Google's own TF release tests run TF on a v3
    assert node.labels["tpuctl-cluster"] == "bert"
    assert node.service_account.email == DEFAULT_SA.split(":")[1]
    script = node.metadata["startup-script"]
    assert f'STORE="gs://{BUCKET}"' in script and 'ROLE="tpu-vm"' in script and 'TPU_ADDRESS="local"' in script
    b = bucket_doc()
    assert b.location == "US-CENTRAL1"
    assert b.labels["tpuctl-cluster"] == "bert" and set(b.labels) == {"tpuctl-cluster", "tpuctl-nonce"}
    assert b.iam_configuration.uniform_bucket_level_access_enabled
    assert b.iam_configuration.public_access_prevention == "enforced"
    policy = bucket_policy(cloud)
    for role in OBJECT_ROLES:
        assert DEFAULT_SA in policy[role]
    record = json.loads(b.blob("tpuctl/cluster.json").download_as_text())
    assert record["tpu_address"] == "local" and record["zone"] == "us-central1-b"

    code, out, err = cli("status", "-c", "bert", "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["resources"]["tpu"]["state"] == "READY"
    assert info["resources"]["bucket"]["location"] == "us-central1"
    assert info["phase"] == "ready"

    code, out, err = cli("down", "-c", "bert", "--yes")
    assert code == 0, err
    assert not cloud.tpu.nodes[2]
    policy = bucket_policy(cloud)
    assert all(DEFAULT_SA not in members for members in policy.values())
    assert bucket_doc() is not None  # kept without --delete-bucket
    assert state.load("bert").phase.value == "down"   # remembered: its logs and outputs are still reachable


@pytest.mark.tpu_nodes
def test_up_status_down_node(cloud, cli):
    code, out, err = cli("up", "--type", "v2-8", "--zone", "us-central1-b", "-c", "bert", "--arch", "node")
    assert code == 0, err
    node = cloud.tpu.nodes[1][f"projects/{PROJECT}/locations/us-central1-b/nodes/tpuctl-bert"]
    assert node.tensorflow_version == "2.12.0"
    vm = cloud.compute.instances[(PROJECT, "us-central1-b", "tpuctl-bert-vm")]
    assert vm["machineType"].endswith("/n1-standard-2")
    assert vm["labels"]["tpuctl-cluster"] == "bert" and set(vm["labels"]) == {"tpuctl-cluster", "tpuctl-nonce"}
    assert vm["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    script = vm["metadata"]["items"][0]["value"]
    assert 'ROLE="node-vm"' in script and 'TF_VERSION="2.12.0"' in script
    policy = bucket_policy(cloud)
    agent = "serviceAccount:service-424242@cloud-tpu.iam.gserviceaccount.com"
    for role in OBJECT_ROLES:
        assert {agent, DEFAULT_SA} <= policy[role]
    record = json.loads(bucket_doc().blob("tpuctl/cluster.json").download_as_text())
    assert record["tpu_address"].startswith("grpc://10.0.0.") and record["tpu_address"].endswith(":8470")

    code, out, err = cli("down", "-c", "bert", "--yes", "--delete-bucket")
    assert code == 0, err
    assert not cloud.tpu.nodes[1] and not cloud.compute.instances
    from google.cloud import storage
    assert storage.Client(project=PROJECT).lookup_bucket(BUCKET) is None


def test_rerun_up_adopts_and_creates_nothing(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    creates = [c for c in cloud.mutating_calls() if "Create" in str(c) or "POST /storage/v1/b" == c]
    cloud.tpu.calls.clear()
    cloud.gcs.calls.clear()
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")
    assert code == 0, err
    assert creates
    assert not [c for c in cloud.tpu.calls if c[1] == "CreateNode"]
    assert "POST /storage/v1/b" not in cloud.gcs.calls
    assert "set IAM" not in err and len(cloud.tpu.nodes[2]) == 1
    assert len(state.load("bert").grants) == 2  # grants recorded once, not duplicated


def test_stockout_in_first_zone_lands_in_second(cloud, cli):
    cloud.tpu.op_faults["CreateNode"].append((8, STOCKOUT))
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-a,us-central1-b", "-c", "bert")
    assert code == 0, err
    assert "us-central1-a" in err and "trying us-central1-b" in err
    assert list(cloud.tpu.nodes[2]) == [f"projects/{PROJECT}/locations/us-central1-b/nodes/tpuctl-bert"]
    assert state.load("bert").zone == "us-central1-b"


def test_stockout_everywhere_fails_and_cleans_up(cloud, cli):
    cloud.tpu.op_faults["CreateNode"] += [(8, STOCKOUT), (8, STOCKOUT)]
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-a", "--zone", "us-central1-b", "-c", "bert")
    assert code == 4, err
    assert "any zone" in err
    assert not cloud.tpu.nodes[2]
    from google.cloud import storage
    assert storage.Client(project=PROJECT).lookup_bucket(BUCKET) is None  # created by this run, removed
    assert state.load("bert") is None


@pytest.mark.tpu_nodes
def test_node_vm_stockout_moves_on_and_removes_the_tpu(cloud, cli):
    cloud.compute.op_faults["insert"].append(("ZONE_RESOURCE_POOL_EXHAUSTED",
                                              "The zone 'us-central1-b' does not have enough resources available"))
    code, out, err = cli("up", "--type", "v2-8", "--zone", "us-central1-b,us-central1-c", "--arch", "node",
                         "-c", "bert")
    assert code == 0, err
    assert [n.split("/")[3] for n in cloud.tpu.nodes[1]] == ["us-central1-c"]
    assert [k[1] for k in cloud.compute.instances] == ["us-central1-c"]


def test_transient_faults_are_retried(cloud, cli):
    cloud.tpu.faults["CreateNode"].append(("UNAVAILABLE", "connection reset"))
    cloud.tpu.faults["GetNode"].append(("UNAVAILABLE", "try again"))
    cloud.gcs.faults["POST /storage/v1/b"].append((503, "backendError"))
    cloud.compute.faults["project"].append((429, "rateLimitExceeded", "Rate Limit Exceeded"))
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")
    assert code == 0, err
    assert len(cloud.tpu.nodes[2]) == 1


def test_interrupted_up_converges(cloud, cli, monkeypatch):
    """Kill `up` while the TPU is still CREATING; the next `up` adopts the node and the bucket."""
    cloud.tpu.delay = 1.0
    from tpuctl.providers.gcp.tpuapi import tpu as tpu_mod

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(tpu_mod.TpuApi, "wait_operation", interrupted)
        code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")
    assert code == 130, err
    assert "run the same `tpuctl up` again" in err
    st = state.load("bert")
    assert st.phase == "creating" and st.zone == "us-central1-b"
    cloud.tpu.delay = 0.2
    cloud.tpu.calls.clear()
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")
    assert code == 0, err
    assert not [c for c in cloud.tpu.calls if c[1] == "CreateNode"]
    assert state.load("bert").phase == "ready"
    assert len(cloud.tpu.nodes[2]) == 1


def test_down_twice_and_missing_resources(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    cloud.tpu.nodes[2].clear()  # deleted behind tpuctl's back
    assert cli("down", "-c", "bert", "--yes")[0] == 0
    calls = len(cloud.mutating_calls())
    code, out, err = cli("down", "-c", "bert", "--yes")
    assert code == 0 and "already down" in err and len(cloud.mutating_calls()) == calls
    assert cli("down", "-c", "bert", "--yes", "--delete-bucket")[0] == 0
    from google.cloud import storage
    assert storage.Client(project=PROJECT).lookup_bucket(BUCKET) is None
    code, out, err = cli("down", "-c", "bert", "--yes")
    assert code == 3 and "no cluster named 'bert'" in err


def test_down_refuses_without_tty_or_yes(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    code, out, err = cli("down", "-c", "bert")
    assert code == 2 and "--yes" in err
    assert len(cloud.tpu.nodes[2]) == 1


def test_ls_flags_orphans(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-a", "-c", "lost")[0] == 0
    state.remove("lost")  # local state gone: the TPU is an orphan still billing
    code, out, err = cli("ls", "--json")
    assert code == 0, err
    rows = {(r["cluster"], r["kind"]): r for r in json.loads(out)}
    assert rows["bert", "cluster"]["orphan"] is False and ("bert", "bucket") not in rows   # the bucket is bert's
    assert rows["lost", "tpu"]["orphan"] is True and rows["lost", "tpu"]["zone"] == "us-central1-a"
    assert rows["lost", "bucket"]["orphan"] is True and rows["lost", "bucket"]["zone"] == "us-central1"
    assert cli("down", "-c", "lost", "--project", PROJECT, "--yes")[0] == 0   # the command ls gives for it


def test_preempted_tpu_is_recreated_by_up(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--spot")[0] == 0
    name = f"projects/{PROJECT}/locations/us-central1-b/nodes/tpuctl-bert"
    assert cloud.tpu.nodes[2][name].scheduling_config.spot
    cloud.tpu.set_state(2, name, "PREEMPTED")
    code, out, err = cli("status", "-c", "bert", "--json")
    assert json.loads(out)["resources"]["tpu"]["state"] == "PREEMPTED"
    assert "PREEMPTED" in json.loads(out)["problem"] and json.loads(out)["fix"] == "tpuctl up -c bert"
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--spot")
    assert code == 0, err
    assert "PREEMPTED" in err
    assert cloud.tpu.nodes[2][name].state.name == "READY"


def test_existing_bucket_in_other_region_is_refused(cloud, cli):
    from google.cloud import storage
    storage.Client(project=PROJECT).create_bucket("elsewhere-data", location="europe-west4")
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--bucket", "elsewhere-data")
    assert code == 2
    assert "europe-west4" in err and "us-central1" in err
    assert not cloud.tpu.mutating_calls()


def test_status_shows_the_hosts_boot_log(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")[0] == 0
    bucket_doc().blob("tpuctl/boot/t1v-n-0.log").upload_from_string(
        "2026-11-22T00:00:00Z [tpu-vm worker 0] boot: cluster bert\n"
        "2026-11-22T00:00:09Z [tpu-vm worker 0] FAILED: pip install agent\n")
    code, out, err = cli("status", "-c", "bert")
    assert code == 0, err
    assert "boot t1v-n-0" in out and "FAILED: pip install agent" in out


def test_bucket_name_taken_by_another_project(cloud, cli):
    cloud.gcs.faults["POST /storage/v1/b"].append((409, "conflict", "Your previous request to create the named "
                                                   "bucket succeeded and you already own it."))
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert")
    assert code == 2 and "already taken" in err and "--bucket" in err
    assert not cloud.tpu.mutating_calls()


def test_a_zone_without_a_fitting_runtime_is_skipped(cloud, cli):
    # Runtimes differ by zone (list_runtime_versions is per location): here us-central1-a offers base images only.
    cloud.tpu.runtimes["us-central1-a"] = ["tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite"]
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-a,us-central1-b", "-c", "bert")
    assert code == 0, err
    assert "no tensorflow runtime for v3-8 in us-central1-a" in err
    assert state.load("bert").zone == "us-central1-b"
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-a", "-c", "jaxc", "--framework", "jax")
    assert code == 0, err
    node = cloud.tpu.nodes[2][f"projects/{PROJECT}/locations/us-central1-a/nodes/tpuctl-jaxc"]
    assert node.runtime_version == "tpu-ubuntu2204-base"   # Google's base image for v4 and older
