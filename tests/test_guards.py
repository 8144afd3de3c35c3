"""Safety guards, each tested so that removing the guard fails a test: ownership labels on adopt and delete,
region-wide failover, a cluster's identity, data edited in place, and the runtime picker's preferences."""
import os
import threading

import pytest
from conftest import PROJECT

from tpuctl.core import datasync, layout, runs, state
from tpuctl.providers.gcp.tpuapi.tpu import pick_runtime
from tpuctl.core.store import LocalStore

pytestmark = pytest.mark.usefixtures("no_leak")   # every test ends with nothing of tpuctl left

ZONE = "us-central1-b"
TPU = f"projects/{PROJECT}/locations/{ZONE}/nodes/tpuctl-bert"
STOCKOUT = "There is no more capacity in the zone \"us-central1-b\"; you can try in another zone"


def _unlabelled_tpu(cloud, name=TPU):
    from google.cloud import tpu_v2
    cloud.tpu.nodes[2][name] = tpu_v2.Node(name=name, accelerator_type="v3-8", state=tpu_v2.Node.State.READY,
                                           labels={"owner": "someone-else"})


def test_up_refuses_to_adopt_an_unlabelled_tpu_and_leaves_it_alone(cloud, cli):
    _unlabelled_tpu(cloud)
    code, out, err = cli("up", "--type", "v3-8", "--zone", ZONE, "-c", "bert")
    assert code == 2, err
    assert "not labelled tpuctl-cluster=bert" in err
    assert TPU in cloud.tpu.nodes[2]                       # still there, untouched
    assert not [c for c in cloud.tpu.mutating_calls() if c[1] == "DeleteNode"]


def test_down_refuses_to_delete_a_tpu_that_lost_its_label(cloud, cli):
    assert cli("up", "--type", "v3-8", "--zone", ZONE, "-c", "bert")[0] == 0
    del cloud.tpu.nodes[2][TPU].labels["tpuctl-cluster"]   # same name, no longer provably ours
    code, out, err = cli("down", "-c", "bert", "--yes")
    assert code == 2, err
    assert "not labelled" in err and TPU in cloud.tpu.nodes[2]
    assert state.load("bert") is not None                   # nothing forgotten: down can be retried


@pytest.mark.tpu_nodes
def test_up_refuses_to_adopt_an_unlabelled_vm_and_removes_the_tpu_it_made(cloud, cli):
    cloud.compute.instances[(PROJECT, ZONE, "tpuctl-bert-vm")] = {"name": "tpuctl-bert-vm", "status": "RUNNING",
                                                                  "labels": {}, "zone": ZONE}
    code, out, err = cli("up", "--type", "v2-8", "--zone", ZONE, "--arch", "node", "-c", "bert")
    assert code == 2, err
    assert "VM tpuctl-bert-vm" in err and "not labelled" in err
    assert (PROJECT, ZONE, "tpuctl-bert-vm") in cloud.compute.instances
    assert not cloud.tpu.nodes[1]                           # the TPU this attempt made is gone again


@pytest.mark.tpu_nodes
def test_down_refuses_to_delete_a_vm_that_lost_its_label(cloud, cli):
    assert cli("up", "--type", "v2-8", "--zone", ZONE, "--arch", "node", "-c", "bert")[0] == 0
    cloud.compute.instances[(PROJECT, ZONE, "tpuctl-bert-vm")]["labels"] = {}
    code, out, err = cli("down", "-c", "bert", "--yes")
    assert code == 2, err
    assert "VM tpuctl-bert-vm" in err
    assert (PROJECT, ZONE, "tpuctl-bert-vm") in cloud.compute.instances


def test_down_never_deletes_a_bucket_it_did_not_label(cloud, cli):
    from google.cloud import storage
    client = storage.Client(project=PROJECT)
    client.create_bucket("users-own-data", location="us-central1")
    client.bucket("users-own-data").blob("corpus.txt").upload_from_string("precious")
    assert cli("up", "--type", "v3-8", "--zone", ZONE, "-c", "bert", "--bucket", "users-own-data")[0] == 0
    code, out, err = cli("down", "-c", "bert", "--yes", "--delete-bucket")
    assert code == 2, err
    assert "bucket users-own-data is not labelled" in err
    assert client.bucket("users-own-data").blob("corpus.txt").download_as_text() == "precious"


def test_a_region_scoped_error_skips_the_rest_of_that_region(cloud, cli):
    cloud.tpu.faults["CreateNode"].append(("RESOURCE_EXHAUSTED", "Quota 'TPUV3DevicePerProjectPerRegionForTPUAPI' "
                                           "exhausted. Limit 0 in region us-central1"))
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-a,us-central1-b,europe-west4-a", "-c", "bert")
    assert code == 0, err
    creates = [c[2].split("/")[3] for c in cloud.tpu.mutating_calls() if c[1] == "CreateNode"]
    assert creates == ["us-central1-a", "europe-west4-a"]   # us-central1-b shares the exhausted region quota
    assert state.load("bert").zone == "europe-west4-a"


@pytest.mark.parametrize("flags,field", [
    (["--type", "v2-8", "--zone", ZONE], "tpu_type v3-8, not v2-8"),
    (["--type", "v3-8", "--zone", ZONE, "--arch", "node"], "arch vm, not node"),
    (["--type", "v3-8", "--zone", ZONE, "--project", "another-project"], f"project {PROJECT}, not another-project"),
])
def test_up_refuses_to_change_what_an_existing_cluster_is(cloud, cli, flags, field):
    assert cli("up", "--type", "v3-8", "--zone", ZONE, "-c", "bert")[0] == 0
    cloud.tpu.calls.clear()
    cloud.compute.calls.clear()
    code, out, err = cli("up", "-c", "bert", *flags)
    assert code == 2, err
    assert f"cluster bert already exists with {field}" in err
    assert not cloud.tpu.mutating_calls() and not cloud.compute.mutating_calls()
    assert state.load("bert").spec.tpu_type == "v3-8"


def test_a_data_file_edited_in_place_is_uploaded_again(env, tmp_path):
    f = tmp_path / "data" / "corpus.txt"
    f.parent.mkdir()
    f.write_bytes(b"first version")
    store = LocalStore(str(tmp_path / "store"))
    assert datasync.sync(store, [f.parent], ["data"], runs.new_id(), lambda n: lambda k: None)["uploaded"] == 1
    # unchanged: nothing sent, and the local md5 is now cached by (path, size, mtime)
    assert datasync.sync(store, [f.parent], ["data"], runs.new_id(), lambda n: lambda k: None)["uploaded"] == 0
    st = f.stat()
    f.write_bytes(b"other version")                         # same size: only the content (and mtime) moved
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert f.stat().st_size == st.st_size
    r_id = runs.new_id() + "x"
    r = datasync.sync(store, [f.parent], ["data"], r_id, lambda n: lambda k: None)
    assert r["uploaded"] == 1 and r["bytes_skipped"] == 0
    assert store.read(layout.run_data(r_id) + "data/corpus.txt") == b"other version"
    # unchanged again: nothing is sent
    assert datasync.sync(store, [f.parent], ["data"], runs.new_id(), lambda n: lambda k: None)["uploaded"] == 0


def test_runtime_picker_prefers_pjrt_over_se_and_plain():
    # Listed so that without the preference the first of the equal versions would win.
    assert pick_runtime(["tpu-vm-tf-2.17.0-se", "tpu-vm-tf-2.17.0", "tpu-vm-tf-2.17.0-pjrt"], "v3", False) \
        == "tpu-vm-tf-2.17.0-pjrt"
    assert pick_runtime(["tpu-vm-tf-2.17.0", "tpu-vm-tf-2.17.0-se"], "v3", False) == "tpu-vm-tf-2.17.0-se"


def test_runtime_picker_honours_family_suffixes():
    newest_wrong_family = "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6"
    assert pick_runtime([newest_wrong_family, "tpu-vm-tf-2.17.0-pjrt"], "v3", False) == "tpu-vm-tf-2.17.0-pjrt"
    assert pick_runtime(["tpu-vm-tf-2.18.0-pjrt-v5p-and-below", "tpu-vm-tf-2.17.0-pjrt"], "v6e", False) \
        == "tpu-vm-tf-2.17.0-pjrt"
    # Where a family build exists beside the generic one, the family's build is chosen.
    assert pick_runtime(["tpu-vm-tf-2.18.0-pjrt", newest_wrong_family], "v6e", False) == newest_wrong_family
    assert pick_runtime(["tpu-vm-tf-2.18.0-pod-pjrt-v5p-and-below", "tpu-vm-tf-2.18.0-pjrt-v5p-and-below"],
                        "v3", True) == "tpu-vm-tf-2.18.0-pod-pjrt-v5p-and-below"


def test_a_kill_after_the_grant_applied_leaks_no_grant(cloud, cli):
    """SIGKILL to `up` right after Google applied the bucket grant, before the answer came back."""
    import os
    import signal
    import subprocess
    import sys
    from google.cloud import storage
    proc = subprocess.Popen([sys.executable, "-m", "tpuctl", "up", "--type", "v3-8", "--zone", ZONE, "-c", "kill",
                             "--yes"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    cloud.gcs.after_iam_set = lambda: os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    cloud.gcs.after_iam_set = None
    bucket = storage.Client(project=PROJECT).bucket(f"{PROJECT}-tpuctl-kill")
    member = "serviceAccount:424242-compute@developer.gserviceaccount.com"

    def holders():
        return {r["role"] for r in bucket.get_iam_policy(requested_policy_version=3).bindings if member in r["members"]}
    assert holders()                                     # the grant is on the bucket...
    assert len(state.load("kill").grants) == 2           # ...and was recorded before it was written
    code, out, err = cli("down", "-c", "kill", "--yes", "--delete-bucket")
    assert code == 0, err
    assert not cloud.tpu.nodes[2]


def test_a_grant_that_was_there_before_is_never_revoked(cloud, cli):
    from google.cloud import storage
    client = storage.Client(project=PROJECT)
    b = client.create_bucket("shared-data", location="us-central1")
    member = "serviceAccount:424242-compute@developer.gserviceaccount.com"
    policy = b.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    policy.bindings.append({"role": "roles/storage.objectAdmin", "members": {member}})
    b.set_iam_policy(policy)
    cloud.foreign.add(f"grant roles/storage.objectAdmin to {member} on shared-data")
    assert cli("up", "--type", "v3-8", "--zone", ZONE, "-c", "bert", "--bucket", "shared-data")[0] == 0
    assert [g.role for g in state.load("bert").grants] == ["roles/storage.legacyBucketReader"]
    assert cli("down", "-c", "bert", "--yes")[0] == 0
    roles = {r["role"] for r in b.get_iam_policy(requested_policy_version=3).bindings if member in r["members"]}
    assert roles == {"roles/storage.objectAdmin"}        # the user's own grant stays; ours is gone


def test_a_create_whose_answer_was_lost_is_adopted_as_this_runs_own(cloud, cli):
    cloud.tpu.lost["CreateNode"] = 1              # applied, then the connection dropped: the retry meets ALREADY_EXISTS
    code, out, err = cli("up", "--type", "v3-8", "--zone", ZONE, "-c", "bert")
    assert code == 0, err
    assert "created by this run, answer lost: adopting" in err
    assert [c[1] for c in cloud.tpu.mutating_calls()].count("CreateNode") == 2
    assert list(cloud.tpu.nodes[2]) == [TPU] and not [c for c in cloud.tpu.mutating_calls() if c[1] == "DeleteNode"]


def test_a_create_lost_then_a_later_failure_undoes_it(cloud, cli):
    cloud.tpu.lost["CreateNode"] = 1
    _fail_the_record_written_after_creation(cloud)
    code, out, err = cli("up", "--type", "v3-8", "--zone", ZONE, "-c", "bert")
    assert code == 5, err                          # a step after the TPU was made fails...
    assert "created by this run, answer lost" in err
    assert not cloud.tpu.nodes[2]                  # ...and the TPU this run made (answer lost or not) is removed


def _fail_the_record_written_after_creation(cloud):
    """The record is written before the TPU is created and again once it is READY: fail the second write."""
    cloud.tpu.before["CreateNode"].append(lambda: cloud.gcs.faults["POST /upload/"].append(
        (403, "forbidden", "no storage.objects.create for you")))


def test_another_machines_up_of_the_same_cluster_is_adopted_never_deleted(cloud, cli):
    from google.cloud import tpu_v2

    def other_machine_creates_first():
        cloud.foreign.add(f"tpu {TPU}")   # the other machine's `down` removes it
        cloud.tpu.nodes[2][TPU] = tpu_v2.Node(name=TPU, accelerator_type="v3-8", state=tpu_v2.Node.State.CREATING,
                                              labels={"tpuctl-cluster": "bert", "tpuctl-nonce": "0ther000"},
                                              network_endpoints=[tpu_v2.NetworkEndpoint(ip_address="10.9.9.9")])
        threading.Timer(0.3, lambda: cloud.tpu.set_state(2, TPU, "READY")).start()
        cloud.gcs.faults["POST /upload/"].append((403, "forbidden", "no storage.objects.create for you"))
    cloud.tpu.before["CreateNode"].append(other_machine_creates_first)
    code, out, err = cli("up", "--type", "v3-8", "--zone", ZONE, "-c", "bert")
    assert "made by another `up`: adopting" in err
    assert code == 5, err                          # this run fails later...
    assert TPU in cloud.tpu.nodes[2]               # ...and leaves the other machine's TPU alone
    assert cloud.tpu.nodes[2][TPU].labels["tpuctl-nonce"] == "0ther000"


def test_a_failed_wait_on_another_machines_tpu_does_not_delete_it(cloud, cli):
    from google.cloud import tpu_v2

    def other_machine_creates_first():
        cloud.foreign.add(f"tpu {TPU}")   # the other machine's `down` removes it
        cloud.tpu.nodes[2][TPU] = tpu_v2.Node(name=TPU, accelerator_type="v3-8", state=tpu_v2.Node.State.CREATING,
                                              labels={"tpuctl-cluster": "bert", "tpuctl-nonce": "0ther000"})
        threading.Timer(0.3, lambda: cloud.tpu.set_state(2, TPU, "TERMINATED")).start()
    cloud.tpu.before["CreateNode"].append(other_machine_creates_first)
    code, out, err = cli("up", "--type", "v3-8", "--zone", ZONE, "-c", "bert")
    assert code == 7, err                          # it never became READY...
    assert TPU in cloud.tpu.nodes[2]               # ...but it is the other machine's to delete, not ours


@pytest.mark.tpu_nodes
def test_a_vm_insert_whose_answer_was_lost_is_adopted_and_another_machines_vm_kept(cloud, cli):
    cloud.compute.lost["insert"] = 1                 # applied, answered 503: the retry meets 409 alreadyExists
    code, out, err = cli("up", "--type", "v2-8", "--zone", ZONE, "--arch", "node", "-c", "bert")
    assert code == 0, err
    assert "created by this run, answer lost: adopting" in err
    assert [k[2] for k in cloud.compute.instances] == ["tpuctl-bert-vm"]
    assert cli("down", "-c", "bert", "--yes")[0] == 0

    def other_machine_first():
        cloud.foreign.add("vm tpuctl-two-vm")   # the other machine's `down` removes it
        cloud.compute.instances[(PROJECT, ZONE, "tpuctl-two-vm")] = {
            "name": "tpuctl-two-vm", "status": "RUNNING", "zone": ZONE,
            "labels": {"tpuctl-cluster": "two", "tpuctl-nonce": "0ther000"}}
    cloud.compute.before["insert"].append(other_machine_first)
    cloud.tpu.op_faults["CreateNode"].append((8, STOCKOUT))   # this up's TPU fails: its undo must spare the VM
    code, out, err = cli("up", "--type", "v2-8", "--zone", ZONE, "--arch", "node", "-c", "two")
    assert code == 4, err
    assert (PROJECT, ZONE, "tpuctl-two-vm") in cloud.compute.instances
