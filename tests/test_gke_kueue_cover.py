"""Issue 49 item 10: Kueue admits only what its ClusterQueue covers. A Workload whose pods ask for cpu or memory
on a queue covering google.com/tpu alone stays pending ("resource cpu unavailable in ClusterQueue": Kueue's
flavorassigner.go, modelled in fakes/kueue.py); the queue `up --kueue` makes covers cpu and memory too, so the
same JobSet is admitted. Kueue's controller is stepped by hand: no pods run here."""
from __future__ import annotations

import types

import pytest

from fakes.k8s_server import FakeKube
from fakes.kueue import API, QUEUE_LABEL, FakeKueue
from tpuctl.providers.gke import kueue_install, tputypes


@pytest.fixture
def kube():
    k = FakeKube()
    yield k
    k.stop()


def _jobset(kube, name, queue, resources):
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{name}"
    kube.put(path, {"kind": "JobSet", "metadata": {"name": name, "namespace": "default",
                                                   "labels": {QUEUE_LABEL: queue}},
                    "spec": {"suspend": True, "replicatedJobs": [{"name": "slice", "replicas": 1, "template": {
                        "spec": {"parallelism": 1, "template": {"spec": {"containers": [
                            {"name": "main", "resources": resources}]}}}}}]}})
    return path


def _workload(kube, name):
    return kube.objects[f"{API}/namespaces/default/workloads/jobset-{name}"]


ASKS_CPU = {"limits": {"google.com/tpu": 4}, "requests": {"cpu": "2", "memory": "8Gi"}}


def test_a_pod_asking_for_cpu_waits_on_a_tpu_only_queue_and_is_admitted_on_tpuctls(kube):
    kueue = FakeKueue(kube, types.SimpleNamespace(controllers=[]))
    kueue.install(chips=8)   # a ClusterQueue covering google.com/tpu only
    _jobset(kube, "a", "lq", ASKS_CPU)
    _jobset(kube, "zero", "lq", {"limits": {"google.com/tpu": 4}, "requests": {"cpu": "0"}})
    kueue.step()
    cond = {c["type"]: c for c in _workload(kube, "a")["status"]["conditions"]}
    assert cond["QuotaReserved"]["status"] == "False"
    assert cond["QuotaReserved"]["message"] == ("couldn't assign flavors to pod set slice: resource cpu "
                                                "unavailable in ClusterQueue")
    assert kube.objects["/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/a"]["spec"]["suspend"] is True
    # a zero request is no request (flavorassigner's "zero resource request not in clusterQueue should succeed")
    assert kube.objects["/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/zero"]["spec"]["suspend"] is False
    for obj in kueue_install.queue_objects(tputypes.shape("v6e-4"), 2):   # what `up --kueue` makes
        kube.put(kueue_install._queue_path(obj), obj)
    _jobset(kube, "b", kueue_install.LOCAL_QUEUE, ASKS_CPU)
    kueue.step()
    assert {c["type"]: c["status"] for c in _workload(kube, "b")["status"]["conditions"]}["Admitted"] == "True"
    assert kube.objects["/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/b"]["spec"]["suspend"] is False
