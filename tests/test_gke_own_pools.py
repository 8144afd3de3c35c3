"""Issue 57 item 4: the node pools tpuctl makes are its own in Kubernetes too (label and NoSchedule taint
tpuctl-cluster=<cluster>); its runs select and tolerate them, so another team's pods of the same TPU shape do not
land on them and tpuctl's run does not land on theirs; a run placed by a team's queue on an adopted cluster
tolerates them and is placed by the queue's ResourceFlavors, checked at submit."""
import pytest

from tpuctl.core.errors import TpuctlError
from tpuctl.providers.gke import container, kueue, manifest, tputypes
from tpuctl.providers.gke.runs import GkeRuns, run_objects

from jobs import make_job
from test_gke_namespace import kueue_cluster
from test_gke_runs import JOB, _ended, _pod_logs, _run_ids, gke  # noqa: F401 (fixture)

API = "/apis/kueue.x-k8s.io/v1beta1"


def test_the_pools_up_makes_carry_the_kubernetes_label_and_taint():
    pool = container.build_node_pool("tpuctl-c1-np-0", tputypes.shape("v6e-16"), "us-east5-b",
                                     {"tpuctl-cluster": "c1"}, "sa@p.iam.gserviceaccount.com", False, "")
    assert dict(pool.config.labels) == {"tpuctl-cluster": "c1"}
    (taint,) = pool.config.taints
    assert (taint.key, taint.value, taint.effect.name) == ("tpuctl-cluster", "c1", "NO_SCHEDULE")


def _pod(**kw):
    r = manifest.RunObjects(cluster="c1", run_id="20261129-100312-123-ab12", shape=tputypes.shape("v6e-16"),
                            slices=1, max_restarts=0, image="i", store_uri="gs://b", agent_version="1", **kw)
    return manifest.build_jobset(r)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_pods_select_and_tolerate_tpuctls_pools_unless_a_teams_queue_places_them():
    toleration = {"key": "tpuctl-cluster", "operator": "Equal", "value": "c1", "effect": "NoSchedule"}
    own = _pod()
    assert own["nodeSelector"]["tpuctl-cluster"] == "c1" and toleration in own["tolerations"]
    team = _pod(queue="lq", own_pools=False)
    assert "tpuctl-cluster" not in team["nodeSelector"] and toleration in team["tolerations"]


def test_a_run_lands_on_tpuctls_pools_not_on_anothers_of_the_same_shape(gke, cli, tmp_path):
    fake, cluster, make = gke
    shape = tputypes.shape("v6e-4")
    # another team's pool of the same shape, listed first: a pod selecting only accelerator and topology lands there
    cluster.add_node_pool("team-pool", 1, {manifest.ACCELERATOR_LABEL: shape.accelerator,
                                           manifest.TOPOLOGY_LABEL: shape.topology})
    make("own", "v6e-4")
    job = make_job(tmp_path, JOB, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "own")
    assert code == 0, err + _pod_logs(fake)
    (run_id,) = _run_ids(fake)
    _ended(fake, run_id, "Completed")
    pods = [o for p, o in fake.objects.items() if "/pods/" in p]
    assert {p["spec"]["nodeName"] for p in pods} == {"gke-tpuctl-own-np-0-0"}
    # a pod of the team's, with xpk's selectors and toleration only, is not scheduled on tpuctl's pool
    foreign = {"metadata": {"name": "x"}, "spec": {"nodeSelector": {manifest.ACCELERATOR_LABEL: shape.accelerator,
                                                                    manifest.TOPOLOGY_LABEL: shape.topology},
                                                   "tolerations": [{"key": "google.com/tpu", "operator": "Exists"}]},
               "status": {"phase": "Pending"}}
    assert cluster._schedule(foreign, []) == "gke-team-pool-0"
    assert cluster._schedule(foreign, [("p", {"spec": {"nodeName": "gke-team-pool-0"},
                                               "status": {"phase": "Running"}})]) == ""


@pytest.fixture
def api(monkeypatch):
    fake, client = kueue_cluster(monkeypatch)
    fake.put(f"{API}/namespaces/default/localqueues/lq", {"kind": "LocalQueue", "metadata": {
        "name": "lq", "namespace": "default"}, "spec": {"clusterQueue": "team-cq"}})
    fake.put(f"{API}/clusterqueues/team-cq", {"kind": "ClusterQueue", "metadata": {"name": "team-cq"}, "spec": {
        "resourceGroups": [{"coveredResources": ["google.com/tpu"], "flavors": [
            {"name": "v5e", "resources": [{"name": "google.com/tpu", "nominalQuota": 16}]}]}]}})
    fake.put(f"{API}/resourceflavors/v5e", {"kind": "ResourceFlavor", "metadata": {"name": "v5e"}, "spec": {
        "nodeLabels": {manifest.ACCELERATOR_LABEL: "tpu-v5-lite-podslice", manifest.TOPOLOGY_LABEL: "4x4"}}})
    yield fake, client
    fake.stop()


def test_a_teams_queue_whose_flavors_do_not_cover_the_shape_is_refused(api):
    fake, a = api
    assert kueue.check_flavors(a, "default", "lq", "tpu-v5-lite-podslice", "4x4") == "team-cq"
    with pytest.raises(TpuctlError, match="ClusterQueue team-cq has no ResourceFlavor for tpu-v6e-slice 4x4") as e:
        kueue.check_flavors(a, "default", "lq", "tpu-v6e-slice", "4x4")
    assert "v5e (tpu-v5-lite-podslice 4x4)" in e.value.hint


def test_submit_through_a_teams_queue_on_an_adopted_cluster(api):
    fake, a = api
    from tpuctl.core.models import ClusterSpec, ClusterState, ProviderName
    st = ClusterState(spec=ClusterSpec(name="ad", provider=ProviderName.GKE, tpu_type="v6e-16", store="gs://b"),
                      zone="z", record={"gke": {"adopted": True, "tpu_type": "v6e-16", "slices": 1}})
    job = type("J", (), {"name": "j", "framework": __import__("tpuctl.core.models", fromlist=["Framework"])
                         .Framework.JAX, "env": {}, "keras_backend": ""})()
    runs_ = GkeRuns(connect=lambda rec: a)
    with pytest.raises(TpuctlError, match="has no ResourceFlavor for tpu-v6e-slice 4x4"):
        runs_.check_run(st, job, 0, "lq", "")
    assert run_objects(st, "r", 0, queue="lq").own_pools is False
    assert run_objects(st, "r", 0).own_pools is True
    st.record["gke"]["adopted"] = False   # a cluster tpuctl made: its own pools, whatever the queue
    assert run_objects(st, "r", 0, queue="lq").own_pools is True


def test_pools_of_an_older_tpuctl_without_the_label_still_take_the_run(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("old", "v6e-4", own=False)
    job = make_job(tmp_path, JOB, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "old")
    assert code == 0, err + _pod_logs(fake)
    assert "no node is labelled tpuctl-cluster=old" in err
    (run_id,) = _run_ids(fake)
    _ended(fake, run_id, "Completed")
