"""Units of the Compute Engine TPU path: JAX's cluster when its detection fails, the catalog's Compute shapes and
is_tpu_type."""
import sys
import types

import pytest

from tpuctl.core.catalog import compute_shape, is_tpu_type, tpu_type
from tpuctl.host import jaxcluster


def _fake_jax(monkeypatch, detected: bool):
    calls = []

    def initialize(**kwargs):
        calls.append(kwargs)
        if not kwargs and not detected:
            raise ValueError("coordinator_address should be defined.")   # jax/_src/distributed.py

    class Dev:
        platform = "tpu"
    jax = types.ModuleType("jax")
    jax.distributed = types.SimpleNamespace(initialize=initialize)
    jax.devices = lambda: [Dev()]
    jax.process_count = lambda: 1
    jax.process_index = lambda: 0
    keras = types.ModuleType("keras")
    keras.__version__ = "3.12.0"     # runtime.require_keras: a run across hosts needs keras>=3.11
    keras.distribution = types.SimpleNamespace(list_devices=lambda: ["d0"], DataParallel=None,
                                               set_distribution=None)
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "keras", keras)
    return calls


ENV = {"TPUCTL_NUM_WORKERS": "2", "TPUCTL_JAX_COORDINATOR": "vm-abcd:8482", "TPUCTL_JAX_NUM_PROCESSES": "2",
       "TPUCTL_JAX_PROCESS_ID": "1"}


def test_jax_gets_the_cluster_from_the_agent_when_its_detection_fails(monkeypatch):
    from tpuctl import runtime
    calls = _fake_jax(monkeypatch, detected=False)
    runtime.jax_replicas(ENV)
    assert calls == [{}, {"coordinator_address": "vm-abcd:8482", "num_processes": 2, "process_id": 1}]


def test_jax_detection_that_works_is_left_alone(monkeypatch):
    from tpuctl import runtime
    calls = _fake_jax(monkeypatch, detected=True)
    runtime.jax_replicas(ENV)
    assert calls == [{}]


def test_without_the_agents_cluster_the_failure_stays_jaxs(monkeypatch):
    from tpuctl import runtime
    _fake_jax(monkeypatch, detected=False)
    with pytest.raises(ValueError, match="coordinator_address"):
        runtime.jax_replicas({"TPUCTL_NUM_WORKERS": "2"})


def test_the_coordinator_is_the_first_endpoint_on_one_slice_and_the_records_on_several(monkeypatch):
    monkeypatch.setattr(jaxcluster.google_api, "attribute", lambda name: "vm-b,vm-a" if
                        name == "worker-network-endpoints" else "")
    record = {"api": "compute", "coordinator": "10.0.0.9", "slices": 1}
    assert jaxcluster.environment(record, 1, 2) == {"TPUCTL_JAX_COORDINATOR": "vm-b:8482",
                                                    "TPUCTL_JAX_NUM_PROCESSES": "2", "TPUCTL_JAX_PROCESS_ID": "1"}
    assert jaxcluster.environment({**record, "slices": 2}, 3, 4)["TPUCTL_JAX_COORDINATOR"] == "10.0.0.9:8482"
    assert jaxcluster.environment({**record, "api": "tpu"}, 1, 2) == {}     # the TPU API's VMs: JAX finds them
    assert jaxcluster.environment(record, 0, 1) == {}                       # one host: nothing to find
    assert jaxcluster.first_endpoint("n-0:0:10.1.2.3,n-1:1:10.1.2.4") == "10.1.2.3"   # the TPU API's form


@pytest.mark.parametrize("name, machine, vms, topology", [
    ("tpu7x-8", "tpu7x-standard-4t", 1, "2x2x1"), ("tpu7x-16", "tpu7x-standard-4t", 2, "2x2x2"),
    ("tpu7x-64", "tpu7x-standard-4t", 8, "2x4x4"), ("v6e-1", "ct6e-standard-1t", 1, "1x1"),
    ("v6e-8", "ct6e-standard-8t", 1, "2x4"), ("v6e-16", "ct6e-standard-4t", 4, "4x4"),
    ("v5p-8", "ct5p-hightpu-4t", 1, "2x2x1"), ("v5p-32", "ct5p-hightpu-4t", 4, "2x2x4")])
def test_compute_shapes(name, machine, vms, topology):
    s = compute_shape(tpu_type(name))
    assert (s.machine_type, s.vms, s.topology) == (machine, vms, topology)
    assert s.vms == tpu_type(name).hosts   # as many VMs as the TPU API's slice has hosts


@pytest.mark.parametrize("name, want", [("tpu7x-16", True), ("v2-8", True), ("v5litepod-4", True), ("v6e-1", True),
                                        ("gpu:2", False), ("cpu", False), ("kaggle:TpuV5E8", False), ("", False),
                                        ("notebook", False)])
def test_is_tpu_type(name, want):
    assert is_tpu_type(name) is want


def test_tpu7x_is_a_tpu_to_the_agent():
    from tpuctl.core import backends
    from tpuctl.host import tpuenv
    record = {"arch": "vm", "hosts": 1, "runtime": "ubuntu-accel-2404-amd64-tpu-tpu7x", "tensorflow_from": "pip"}
    assert backends.for_host(record, "tpu7x-8", True)[0] == "jax"
    assert tpuenv.tpu_environment("pytorch", record, "tpu7x-8") == {"PJRT_DEVICE": "TPU"}


def test_up_again_keeps_the_compute_engine_flags_the_cluster_was_made_with():
    from tpuctl.core.models import ClusterSpec
    from tpuctl.providers.base import UpFlags
    spec = ClusterSpec(name="c", provider="gcp", tpu_type="tpu7x-8", project="p", api="compute", flex_start=True,
                       flex_wait=1800, disk_size=200, disk_type="hyperdisk-ml", internal_ips=True)
    flags = UpFlags()
    flags.remember(spec)
    assert (flags.flex_start, flags.flex_wait, flags.disk_size, flags.disk_type, flags.internal_ips) == \
        (True, "1800s", 200, "hyperdisk-ml", True)
