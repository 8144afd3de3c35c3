"""What Google says while it will not make a Compute Engine TPU slice (issue 59): a MIG Google refuses keeps its VMs
CREATING and retries, saying why only in each VM's lastAttempt, a bulk MIG's last progress check or its accelerator
topology's state (GCE_TPU_FACTS §3 "States you can observe"). `up` reads all three on every poll: a stockout moves
to the next zone, anything else ends `up` on the poll that first sees it, in Google's words, with nothing left."""
import pytest
from conftest import PROJECT

from tpuctl.providers.gcp.compute import gce, gce_errors

pytestmark = pytest.mark.usefixtures("no_leak")

ZONE = "us-central1-c"
# Texts: the machine-type one is the message gcloud's own regex matches (surface/compute/instances/create.py:832);
# the others are Google's usual wording for these causes. Which codes a TPU MIG's lastAttempt carries is
# UNVERIFIED (no captured refusal found), so the tests match on the message as tpuctl does.
MACHINE = ("INVALID_FIELD_VALUE", "Invalid value for field 'resource.machineType': 'tpu7x-standard-4t'. Machine type "
           "with name 'tpu7x-standard-4t' does not exist in zone 'us-central1-c'.")
ACCOUNT = ("SERVICE_ACCOUNT_ACCESS_DENIED", "The user does not have access to service account 'run@p.iam."
           "gserviceaccount.com'. Ask a project owner to grant you the iam.serviceAccountUser role on the service "
           "account.")
RESERVATION = ("RESOURCE_NOT_FOUND", "The resource 'projects/p/zones/us-central1-c/reservations/r1' was not found")
TOPOLOGY = ("CONDITION_NOT_MET", "The accelerator topology 2x2x2 cannot be provisioned in zone us-central1-c.")


@pytest.fixture
def short_deadline(monkeypatch):
    """Without reading the errors, `up` would wait for CREATING until this deadline (30 min by default)."""
    monkeypatch.setattr(gce, "CREATE_DEADLINE", 4.0)


def _polls_before_cleanup(cloud):
    """listManagedInstances calls between the MIG insert and the first MIG delete: the wait's polls, and the
    clean-up's own look at what is there."""
    actions = [a for a, _ in cloud.compute.calls]
    start = actions.index("mig_insert")
    end = actions.index("mig_delete") if "mig_delete" in actions else len(actions)
    return actions[start:end].count("mig_managed")


@pytest.mark.parametrize("where, error, flags, said", [
    ("lastAttempt", ACCOUNT, [], "roles/iam.serviceAccountUser"),
    ("bulk", RESERVATION, ["--reservation", "r1"], "check --reservation"),
    ("topology", TOPOLOGY, [], "accelerator topology"),
], ids=["last-attempt", "bulk-progress-check", "topology-failed"])
def test_a_mig_google_refuses_ends_up_within_one_poll_and_leaves_nothing(cloud, cli, short_deadline, where, error,
                                                                        flags, said):
    cloud.compute.add_reservation(PROJECT, ZONE, "r1", "dense")   # bulk: a reservation-bound MIG
    cloud.compute.mig_refusal = (where, *error)
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "ir", *flags, "--yes")
    assert code != 0 and "Traceback" not in err, err
    assert error[1] in err and said in err and "still CREATING" not in err, err
    assert _polls_before_cleanup(cloud) <= 2, cloud.compute.calls
    assert cloud.leaks() == []


def test_a_zone_without_the_machine_type_moves_to_the_next_zone(cloud, cli, short_deadline):
    cloud.compute.mig_refusal, cloud.compute.mig_refusal_zones = ("lastAttempt", *MACHINE), {ZONE}
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", f"{ZONE},us-central1-ai1a", "-c", "ir", "--yes")
    assert code == 0, err
    assert "does not exist in zone" in err and "trying us-central1-ai1a" in err, err
    assert set(cloud.compute.migs) == {(PROJECT, "us-central1-ai1a", "tpuctl-ir")}


def test_a_bulk_mig_without_capacity_waits_and_says_so(cloud, cli, short_deadline):
    """A bulk MIG (here reservation-bound) waits for all its capacity by design: a stockout in its progress check is
    no reason to leave the zone, and the wait's end says what Google said."""
    cloud.compute.stockout_zones = {ZONE}
    cloud.compute.add_reservation(PROJECT, ZONE, "r1", "dense")
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "--reservation", "r1", "-c", "ir", "--yes")
    assert code != 0 and "still CREATING" in err, err
    assert cloud.leaks() == []


def test_mig_errors_reads_the_three_places_by_their_compute_v1_names():
    """The field names, against google-cloud-compute's own types (compute_v1 1.57: ManagedInstance.last_attempt,
    InstanceGroupManagerStatus.bulk_instance_operation / applied_accelerator_topologies)."""
    from google.cloud import compute_v1 as c
    err = c.Error(errors=[c.Errors(code="X", message="m")])
    mig = c.InstanceGroupManager(status=c.InstanceGroupManagerStatus(
        bulk_instance_operation=c.InstanceGroupManagerStatusBulkInstanceOperation(
            in_progress=True, last_progress_check=c.InstanceGroupManagerStatusBulkInstanceOperationLastProgressCheck(
                error=err)),
        applied_accelerator_topologies=[
            c.InstanceGroupManagerStatusAcceleratorTopology(accelerator_topology="2x2x2", state="ACTIVATING"),
            c.InstanceGroupManagerStatusAcceleratorTopology(   # short of VMs: not a refusal (capacity would count)
                accelerator_topology="2x2x2", state="INCOMPLETE",
                state_details=c.InstanceGroupManagerStatusAcceleratorTopologyAcceleratorTopologyStateDetails(
                    error=c.Error(errors=[c.Errors(code="Z", message="insufficient running VMs")]))),
            c.InstanceGroupManagerStatusAcceleratorTopology(
                accelerator_topology="2x2x2", state="FAILED",
                state_details=c.InstanceGroupManagerStatusAcceleratorTopologyAcceleratorTopologyStateDetails(
                    error=c.Error(errors=[c.Errors(code="T", message="t")])))]))
    members = [c.ManagedInstance(name="vm-a", last_attempt=c.ManagedInstanceLastAttempt(
        errors=c.ManagedInstanceLastAttemptErrors(errors=[c.Errors(code="Y", message="n")]))),
        c.ManagedInstance(name="vm-b")]
    got = gce_errors.mig_errors(mig, members)
    assert [(code, message) for _, code, message in got] == [("Y", "n"), ("X", "m"), ("T", "t")]
    assert gce_errors.mig_errors(c.InstanceGroupManager(), [c.ManagedInstance(name="vm")]) == []


def test_a_zone_without_the_machine_type_moves_a_single_vm_to_the_next_zone(cloud, cli):
    """The insert's 400 (the text gcloud's own regex matches, GCE_TPU_FACTS §9) is that zone's answer, not the end."""
    cloud.compute.machine_missing_zones = {ZONE}
    code, out, err = cli("up", "--type", "tpu7x-8", "--zone", f"{ZONE},us-central1-ai1a", "-c", "ir", "--yes")
    assert code == 0, err
    assert "does not exist in zone" in err and "trying us-central1-ai1a" in err, err
    assert (PROJECT, "us-central1-ai1a", "tpuctl-ir") in cloud.compute.instances


def test_a_flex_start_vm_is_not_given_up_at_the_operation_deadline(cloud, cli, monkeypatch):
    """A flex-start insert may stay RUNNING for the whole wait (UNVERIFIED, GCE_TPU_FACTS §4): the operation
    deadline that ends other inserts must not end it, nor make `up` delete what is queued."""
    monkeypatch.setattr(gce, "OPERATION_DEADLINE", 0.3)
    cloud.compute.flex_op_waits, cloud.compute.flex_polls, cloud.compute.flex_no_capacity = True, 12, {ZONE}
    code, out, err = cli("up", "--type", "tpu7x-8", "--flex-start", "--max-duration", "1h", "--zone", ZONE,
                         "-c", "ir", "--yes")
    assert code != 0 and "no flex-start capacity for tpu7x-8" in err and "after 0s" not in err, err
    assert [a for a, _ in cloud.compute.calls].count("delete") == 0   # Google deleted it; tpuctl had no need
    assert cloud.leaks() == []
