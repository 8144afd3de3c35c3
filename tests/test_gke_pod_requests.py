"""Issue 57 item 6: a run's pods request cpu and memory, so that they are not BestEffort (the first pods the kubelet
evicts), wherever Kueue's rule lets them: with no queue, or when the queue's ClusterQueue covers cpu and memory
(tpuctl's own, from `up --kueue`). Through a team's queue whose ClusterQueue covers google.com/tpu alone they ask
for none, since Kueue never admits a Workload requesting a resource its ClusterQueue does not cover
(flavorassigner.go, modelled in fakes/kueue.py); manifest.POD_REQUESTS says the rule and its sources."""
from __future__ import annotations

import pytest

from tpuctl.core import runs
from tpuctl.providers.gke import kube, kueue, kueue_install, manifest, tputypes

from conftest import until
from fakes.k8s_cluster import qos_class
from fakes.k8s_server import FakeKube
from fakes.kueue import FakeKueue
from jobs import make_job
from test_gke_runs import JOB, _jobset, cluster_store, gke  # noqa: F401 (fixture)


def _container(**kw):
    js = manifest.build_jobset(manifest.RunObjects(
        cluster="c", run_id="20261129-100312-123-ab12", shape=tputypes.shape("v6e-4"), slices=1, max_restarts=0,
        image="python:3.12", store_uri="gs://b", agent_version="1.0", **kw))
    return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]


def test_the_pods_request_cpu_and_memory_unless_the_queue_does_not_cover_them():
    assert _container()["resources"] == {"limits": {"google.com/tpu": "4"}, "requests": manifest.POD_REQUESTS}
    assert _container(queue="team-q")["resources"] == {"limits": {"google.com/tpu": "4"}}
    assert _container(queue="multislice-queue", queue_covers=True)["resources"]["requests"] == {"cpu": "1",
                                                                                                "memory": "4Gi"}
    spec = {"containers": [_container()]}
    assert qos_class(spec) == "Burstable"
    assert qos_class({"containers": [_container(queue="team-q")]}) == "BestEffort"


@pytest.fixture
def api(monkeypatch):
    monkeypatch.setenv("CONTAINER_EMULATOR_HOST", "fake")
    monkeypatch.setattr(kube, "_CLIENTS", {})
    fake = FakeKube()
    yield fake, kube.connect(fake.url, "", "")
    fake.stop()


def test_covers_reads_the_localqueues_clusterqueue(api):
    import types
    fake, a = api
    FakeKueue(fake, types.SimpleNamespace(controllers=[])).install(chips=4)   # LocalQueue lq: google.com/tpu only
    assert kueue.covers(a, "default", "lq") is False
    for obj in kueue_install.queue_objects(tputypes.shape("v6e-4"), 1, "default", "c"):   # what `up --kueue` makes
        fake.put(kueue_install._queue_path(obj), obj)
    assert kueue.covers(a, "default", kueue_install.LOCAL_QUEUE) is True
    assert kueue.covers(a, "default", "nosuch") is False


def _pods(fake, run_id):
    return [o for p, o in fake.objects.items() if "/pods/" in p and run_id.lower() in p]


def test_a_run_without_kueue_has_burstable_pods(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("gr", "v6e-4")
    job = make_job(tmp_path, JOB, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "gr", "--detach")
    assert code == 0, err
    run_id = out.strip()
    pods = until(lambda: _pods(fake, run_id), 60, "the run's pods")
    assert {p["status"]["qosClass"] for p in pods} == {"Burstable"}
    until(lambda: runs.status(cluster_store(), run_id).state is runs.RunState.SUCCEEDED, 120, "the run succeeded")


@pytest.mark.parametrize("own_queue", [True, False], ids=["tpuctls-queue", "tpu-only-queue"])
def test_a_queued_run_requests_what_its_clusterqueue_covers_and_is_admitted(gke, cli, tmp_path, own_queue):
    fake, cluster, make = gke
    st = make("gq", "v6e-4")
    FakeKueue(fake, cluster).install(chips=4)   # a team's LocalQueue lq over google.com/tpu only
    if own_queue:
        for obj in kueue_install.queue_objects(tputypes.shape("v6e-4"), 1, "default", st.name):
            fake.put(kueue_install._queue_path(obj), obj)
    queue = kueue_install.LOCAL_QUEUE if own_queue else "lq"
    job = make_job(tmp_path, JOB, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "gq", "--detach", "--queue", queue)
    assert code == 0, err
    run_id = out.strip()
    c = _jobset(fake, run_id)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert ("requests" in c["resources"]) is own_queue
    pods = until(lambda: _pods(fake, run_id), 60, "admitted by Kueue: the run's pods")
    assert {p["status"]["qosClass"] for p in pods} == {"Burstable" if own_queue else "BestEffort"}
    until(lambda: runs.status(cluster_store(), run_id).state is runs.RunState.SUCCEEDED, 120, "the run succeeded")
