"""Ctrl-C at each step of `up` on the Compute Engine path (issue 48): after each request Google applied (its answer
received, nothing yet recorded of it) and while the slice boots. Whatever the moment, `up` says it may be half made
in one line (exit 130), and either `down` leaves nothing or the same `up` again finishes without a second copy of
anything."""
import pytest
from conftest import PROJECT

from tpuctl.providers.gcp.compute import gce

pytestmark = pytest.mark.usefixtures("no_leak")

ZONE = "us-central1-c"
# the inserts of a multi-host slice, in the order up sends them: workload policy, instance template, MIG; a single
# host's one VM
MIG_STEPS = ["ResourcePoliciesClient", "InstanceTemplatesClient", "InstanceGroupManagersClient", "boot"]
VM_STEPS = ["InstancesClient", "boot"]


def _interrupt_at(monkeypatch, step: str) -> None:
    """KeyboardInterrupt right after the `step` insert was answered (the resource exists), or, for "boot", at the
    first wait for the slice's VMs to run."""
    if step == "boot":
        def ready(*a, **k):
            raise KeyboardInterrupt
        monkeypatch.setattr(gce.ComputeTpus, "wait_ready", ready)
        return
    real = gce.call

    def call(fn, *a, **k):
        got = real(fn, *a, **k)
        if getattr(fn, "__name__", "") == "insert_unary" and type(fn.__self__).__name__ == step:
            raise KeyboardInterrupt
        return got
    monkeypatch.setattr(gce, "call", call)


@pytest.mark.parametrize("type_, step", [("tpu7x-16", s) for s in MIG_STEPS] + [("tpu7x-8", s) for s in VM_STEPS])
def test_ctrl_c_at_each_step_of_up_then_down_leaves_nothing(cloud, cli, monkeypatch, type_, step):
    with monkeypatch.context() as m:
        _interrupt_at(m, step)
        code, out, err = cli("up", "--type", type_, "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 130, err
    assert "up interrupted; cluster ir may be half made" in err and "Traceback" not in err, err
    assert cloud.leaks(), "the interrupt came after Google made something"
    code, out, err = cli("down", "-c", "ir", "--yes")
    assert code == 0, err
    assert cloud.leaks() == []


@pytest.mark.parametrize("step", ["ResourcePoliciesClient", "boot"])
def test_ctrl_c_then_up_again_finishes_with_one_of_each(cloud, cli, monkeypatch, step):
    with monkeypatch.context() as m:
        _interrupt_at(m, step)
        assert cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "ir", "--yes")[0] == 130
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    assert list(cloud.compute.templates) == [(PROJECT, "tpuctl-ir-template")]
    assert len(cloud.compute.migs) == 1 and len(cloud.compute.policies) == 1
    assert len([k for k in cloud.compute.instances if k[2].startswith("tpuctl-ir")]) == 2   # tpu7x-16: 2 VMs of 4 chips
    code, out, err = cli("down", "-c", "ir", "--yes")
    assert code == 0, err
    assert cloud.leaks() == []
