"""`up` asks Google which permissions the caller holds before it asks the user anything (Resource Manager's
testIamPermissions, here the wire-level fake in fakes/resource_manager.py)."""
import pytest

from fakes.resource_manager import FakeResourceManager


@pytest.fixture
def rm(cloud, monkeypatch):
    fake = FakeResourceManager()
    monkeypatch.setenv("RESOURCE_MANAGER_EMULATOR_HOST", fake.start())
    yield fake
    fake.stop()


def test_a_missing_tpu_permission_stops_up_before_anything_is_made(rm, cloud, cli):
    rm.held = {"tpu.nodes.get", "tpu.operations.get", "storage.buckets.create", "storage.buckets.setIamPolicy",
               "iam.serviceAccounts.actAs"}
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--yes")
    assert code == 5 and "tpu.nodes.create" in err and "tpu.nodes.delete" in err and "roles/tpu.admin" in err
    assert cloud.mutating_calls() == []
    assert len(rm.calls) == 1 and "tpu.nodes.create" in rm.calls[0][1]


@pytest.mark.tpu_nodes
def test_the_node_architecture_also_needs_compute(rm, cloud, cli):
    rm.held = {p for p in ("tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get", "tpu.operations.get")}
    code, out, err = cli("up", "--type", "v2-8", "--zone", "us-central1-b", "-c", "old", "--arch", "node", "--yes")
    assert code == 5 and "compute.instances.create" in err and "roles/compute.instanceAdmin.v1" in err


def test_missing_storage_rights_only_warn_and_up_goes_on(rm, cloud, cli):
    rm.held = {"tpu.nodes.create", "tpu.nodes.delete", "tpu.nodes.get", "tpu.operations.get"}
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--yes")
    assert code == 0, err
    assert "no project-level storage.buckets.create" in err and "iam.serviceAccounts.actAs" in err
    assert len(rm.calls) == 1                                  # asked once, though checked before and in `up`


def test_a_check_that_cannot_be_made_does_not_stop_up(rm, cloud, cli):
    rm.status = 403
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "bert", "--yes")
    assert code == 0 and "could not check your permissions" in err
