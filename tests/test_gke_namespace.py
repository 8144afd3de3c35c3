"""Issue 57 item 3: a run cannot skip Kueue's queue, and `submit --namespace` puts a run's JobSet, its pods, the
queue lookup and the listing in that namespace."""
import pytest

from tpuctl.core import runs
from tpuctl.core.errors import TpuctlError
from tpuctl.providers.gke import kube, kueue

from fakes.k8s_server import CRD_PREFIX, KUEUE_CRD, FakeKube
from fakes.kueue import FakeKueue
from jobs import make_job
from test_gke_runs import JOB, _ended, _pod_logs, cluster_store, gke  # noqa: F401 (fixture)

LQ = "/apis/kueue.x-k8s.io/v1beta1/namespaces/{}/localqueues/{}"


def kueue_cluster(monkeypatch):
    """A fake Kubernetes API with Kueue's CRD installed, and a client of it (the caller stops the fake)."""
    monkeypatch.setenv("CONTAINER_EMULATOR_HOST", "fake")
    monkeypatch.setattr(kube, "_CLIENTS", {})
    fake = FakeKube()
    fake.put(CRD_PREFIX + KUEUE_CRD, {"kind": "CustomResourceDefinition", "metadata": {"name": KUEUE_CRD}})
    return fake, kube.connect(fake.url, "", "")


@pytest.fixture
def api(monkeypatch):
    fake, client = kueue_cluster(monkeypatch)
    yield fake, client
    fake.stop()


def _queue(fake, ns, name):
    fake.put(LQ.format(ns, name), {"kind": "LocalQueue", "metadata": {"name": name, "namespace": ns},
                                   "spec": {"clusterQueue": "cq"}})


def test_no_localqueue_in_the_namespace_is_refused_naming_where_there_are(api):
    fake, a = api
    with pytest.raises(TpuctlError, match="has no LocalQueue") as e:
        kueue.pick_queue(a, "default", "", "")
    assert "ask its owner" in e.value.hint
    _queue(fake, "team-a", "lq")
    _queue(fake, "team-b", "gpu")
    _queue(fake, "team-b", "tpu")
    with pytest.raises(TpuctlError, match="namespace default has no LocalQueue") as e:
        kueue.pick_queue(a, "default", "", "")
    assert e.value.hint == "LocalQueues are in: --namespace team-a (--queue lq); --namespace team-b (--queue gpu, tpu)"
    assert kueue.pick_queue(a, "team-a", "", "") == "lq"   # the namespace's only one


def test_kueues_default_localqueue_is_taken(api):
    fake, a = api
    _queue(fake, "default", "default")
    _queue(fake, "default", "other")
    assert kueue.pick_queue(a, "default", "", "") == "default"
    assert kueue.pick_queue(a, "default", "other", "") == "other"


def test_a_bad_namespace_is_refused_offline():
    assert kueue.check_namespace("team-a") == "team-a"
    for bad in ("Team", "a" * 64, "a.b", "-a"):
        with pytest.raises(TpuctlError, match="invalid --namespace"):
            kueue.check_namespace(bad)


def test_a_run_in_its_own_namespace(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("gn", "v6e-4")
    FakeKueue(fake, cluster).install(chips=4, namespace="team-a", queue="tq")
    job = make_job(tmp_path, JOB, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "gn", "--detach")   # default has no LocalQueue: refused
    assert code == 2 and "--namespace team-a (--queue tq)" in err, err
    assert not [p for p in fake.objects if "/jobsets/" in p]
    code, out, err = cli("submit", str(job), "-c", "gn", "--detach", "--namespace", "team-a")
    assert code == 0, err
    run_id = out.strip()
    assert runs.job(cluster_store(), run_id).namespace == "team-a"
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets/tpuctl-{run_id}"
    assert fake.objects[path]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "tq"
    from conftest import until
    until(lambda: runs.status(cluster_store(), run_id).state is runs.RunState.SUCCEEDED, 120, "the run succeeded")
    pods = [p for p in fake.objects if "/pods/" in p]
    assert pods and all(p.startswith("/api/v1/namespaces/team-a/pods/") for p in pods), pods + [_pod_logs(fake)]
    from tpuctl.core import state
    from tpuctl.providers.gke.runs import GkeRuns
    seen = GkeRuns().describe(state.load("gn"))   # `status`: the cluster's JobSets in every namespace, with pods
    assert f"tpuctl-{run_id}-slice-0-0-" in str(seen[f"jobset tpuctl-{run_id}"]["pods"])


def test_the_dry_run_writes_the_namespace_and_a_real_length_id(env, cli, tmp_path, monkeypatch):
    import yaml
    from tpuctl.providers.gke import dryrun
    monkeypatch.chdir(tmp_path)
    job = make_job(tmp_path, "print('hi')\n", 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "--dry-run", "--provider", "gke", "--type", "v6e-16", "--slices", "2",
                         "--namespace", "team-a", "--manifest", "-")
    assert code == 0, err
    account, role, binding, js = list(yaml.safe_load_all(out))
    assert js["metadata"]["namespace"] == account["metadata"]["namespace"] == "team-a"
    assert binding["subjects"][0]["namespace"] == "team-a" and "namespace" not in role["metadata"]
    assert js["metadata"]["name"] == f"tpuctl-{dryrun.DRY_RUN_ID}"
    code, out, err = cli("submit", str(job), "--dry-run", "--provider", "gke", "--type", "v6e-16",
                         "--namespace", "Team_A", "--manifest", "-")
    assert code == 2 and "invalid --namespace" in err


def test_the_runs_workload_is_found_by_kueues_job_uid_label(api):
    fake, a = api
    for name, uid in (("old", "uid-of-a-deleted-jobset"), ("new", "uid-now")):
        fake.put(f"/apis/kueue.x-k8s.io/v1beta1/namespaces/default/workloads/jobset-{name}", {
            "kind": "Workload", "metadata": {"name": f"jobset-{name}", "namespace": "default",
                                             "labels": {"kueue.x-k8s.io/job-uid": uid},
                                             "ownerReferences": [{"kind": "JobSet", "name": "tpuctl-x", "uid": uid}]}})
    js = {"metadata": {"name": "tpuctl-x", "namespace": "default", "uid": "uid-now"}}
    assert kueue.workload_of(a, js)["metadata"]["name"] == "jobset-new"
    assert kueue.workload_of(a, dict(js, metadata={**js["metadata"], "uid": "none"})) is None


CONVERSION = ('conversion webhook for kueue.x-k8s.io/v1beta2, Kind=LocalQueue failed: Post "https://kueue-webhook-'
              'service.kueue-system.svc:443/convert?timeout=30s": no endpoints available for service '
              '"kueue-webhook-service"')


def test_kueues_conversion_webhook_down_is_waited_out_then_said(api, monkeypatch):
    fake, a = api
    _queue(fake, "default", "lq")
    fake.faults += [("GET", "/apis/kueue.x-k8s.io/", 500, CONVERSION)] * 2   # Kueue's replica restarting
    assert kueue.pick_queue(a, "default", "", "") == "lq"
    monkeypatch.setenv("TPUCTL_GKE_JOBSET_READY_SECONDS", "0")
    fake.faults += [("GET", "/apis/kueue.x-k8s.io/", 500, CONVERSION)]
    with pytest.raises(TpuctlError, match="Kueue's conversion webhook did not serve for 0s"):
        kueue.pick_queue(a, "default", "", "")


def test_priority_names_a_kueue_workload_priority_class(gke, cli, tmp_path):
    from conftest import until
    fake, cluster, make = gke
    make("gw", "v6e-4")
    FakeKueue(fake, cluster).install(chips=4)
    fake.put("/apis/kueue.x-k8s.io/v1beta1/workloadpriorityclasses/team-urgent", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "WorkloadPriorityClass",
        "metadata": {"name": "team-urgent"}, "value": 5000})
    job = make_job(tmp_path, JOB, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "gw", "--detach", "--priority", "team-urgent")
    assert code == 0, err
    run_id = out.strip()
    js = fake.objects[f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/tpuctl-{run_id}"]
    assert js["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "team-urgent"
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "priorityClassName" not in pod
    wl = until(lambda: fake.objects.get(f"/apis/kueue.x-k8s.io/v1beta1/namespaces/default/workloads/"
                                        f"jobset-tpuctl-{run_id}"), 10, "the Workload")
    assert wl["spec"]["priority"] == 5000
    code, out, err = cli("submit", str(job), "-c", "gw", "--detach", "--priority", "nosuch")
    assert code == 2 and "WorkloadPriorityClasses: team-urgent" in err
    _ended(fake, run_id, "Completed")


def test_submit_and_its_dry_run_default_to_the_clusters_namespace(gke, cli, tmp_path, monkeypatch):
    fake, cluster, make = gke
    import yaml
    from tpuctl.core import state
    st = make("gn", "v6e-4")
    st.spec.namespace = "team-a"   # as `up --namespace team-a` records it
    state.save(st)
    FakeKueue(fake, cluster).install(chips=4, namespace="team-a", queue="tq")
    job = make_job(tmp_path, JOB, 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "gn", "--detach")
    assert code == 0, err
    run_id = out.strip()
    assert runs.job(cluster_store(), run_id).namespace == "team-a"   # jobs, logs, cancel read it there
    assert f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets/tpuctl-{run_id}" in fake.objects
    assert cli("cancel", run_id, "-c", "gn")[0] == 0
    assert not [p for p in fake.objects if "/jobsets/" in p]
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("submit", str(job), "-c", "gn", "--dry-run", "--manifest", "-")
    assert code == 0, err
    assert list(yaml.safe_load_all(out))[-1]["metadata"]["namespace"] == "team-a"
    code, out, err = cli("submit", str(job), "-c", "gn", "--dry-run", "--manifest", "-", "--namespace", "other")
    assert code == 0, err
    assert list(yaml.safe_load_all(out))[-1]["metadata"]["namespace"] == "other"   # the flag wins
