"""Issue 57 items 1 and 2: the Kubernetes fake refuses what the API server refuses (names, label keys and values,
annotation size, custom resources against the shipped CRDs' schemas), its JobSet controller writes what JobSet
v0.10.1 writes, and every manifest tpuctl can produce passes through all of it, with each Job and pod JobSet and
the Job controller derive from it. The 73-character coordinator label of issue 57 fails here."""
import copy
import functools

import pytest

from tpuctl.core import runs
from tpuctl.providers.gke import dryrun, jobset_install, kueue_install, manifest, tputypes

from conftest import until
from fakes import k8s_validation as v
from fakes.k8s_cluster import FakeCluster, build_job, build_pod
from fakes.k8s_server import CRD_PREFIX, JOBSET_CRD, FakeKube, _jobset_webhook

RUN_ID = "20261129-100312-123-ab12"        # core/runs.new_id's length
OLD_COORDINATOR = f"tpuctl-{RUN_ID}-slice-0-0.tpuctl-{RUN_ID}"   # JobSet's coordinator label for it: 73 characters
LONGEST_CLUSTER = "c" + "x" * 23            # core/models.check_cluster_name: 1-24 characters
LONGEST_QUEUE = "q" * 63                    # a label value's most (kueue.LABEL_VALUE_MAX)


def test_run_ids_and_the_dry_runs_placeholder_are_as_long():
    assert len(runs.new_id()) == len(RUN_ID) == len(dryrun.DRY_RUN_ID)
    assert runs.is_id(dryrun.DRY_RUN_ID)


@pytest.mark.parametrize("kind,name,bad", [
    ("Pod", "a" * 253, False), ("Pod", "a" * 254, True), ("Pod", "A", True), ("Service", "1a", True),
    ("Service", "a" * 64, True), ("Namespace", "a.b", True), ("JobSet", "x.y-z", False), ("Job", "-x", True)])
def test_names_by_kind(kind, name, bad):
    assert bool(v.problems({"kind": kind, "metadata": {"name": name}})) is bad


@pytest.mark.parametrize("labels,bad", [
    ({"a": "x" * 63}, False), ({"a": "x" * 64}, True), ({"a": "-x"}, True), ({"a": ""}, False),
    ({"example.com/" + "k" * 63: "v"}, False), ({"example.com/" + "k" * 64: "v"}, True), ({"Bad_/x": "v"}, True),
    ({"jobset.sigs.k8s.io/coordinator": "tpuctl-20261129-100312-123-ab12-slice-0-0.tpuctl-20261129-100312-123-ab12"},
     True)])
def test_label_keys_and_values(labels, bad):
    assert bool(v.problems({"kind": "Pod", "metadata": {"name": "p", "labels": labels}})) is bad


def test_annotations_hold_256_kib_in_all():
    ok = {"kind": "Pod", "metadata": {"name": "p", "annotations": {"a": "x" * (256 * 1024 - 1)}}}
    assert not v.problems(ok)
    assert v.problems({"kind": "Pod", "metadata": {"name": "p", "annotations": {"a": "x" * (256 * 1024)}}})
    assert v.problems({"kind": "Pod", "metadata": {"name": "p", "annotations": {"no good": "x"}}})


def _run(tpu_type="v6e-16", slices=1, queue="", priority="", cluster=LONGEST_CLUSTER, run_id=RUN_ID,
         namespace="default"):
    shape = tputypes.shape(tpu_type)
    return manifest.RunObjects(cluster=cluster, run_id=run_id, shape=shape, slices=slices, max_restarts=5,
                               image="python:3.12-slim-bookworm", store_uri="gs://b", agent_version="1.2.3",
                               workload_policy=dryrun.workload_policy_name(cluster) if shape.needs_workload_policy
                               else "", queue=queue, priority=priority, namespace=namespace)


@functools.lru_cache(maxsize=1)
def _jobset_schema():
    from tpuctl.providers.gke import schema
    return schema.version_schema(jobset_install.release_crd(), "v1alpha2")


def _derived_problems(js):
    """What the API server and JobSet's webhook would refuse of the JobSet, then of every Job JobSet v0.10.1 makes
    of it (fakes/k8s_cluster.build_job) and every pod the Job controller makes of those (build_pod)."""
    js = copy.deepcopy(js)
    js["metadata"]["uid"] = "0b6f1a52-6e0e-4f5c-9a57-3d2f1a2b3c4d"
    out = v.problems(js, _jobset_schema()) + ([w] if (w := _jobset_webhook(js)) else [])
    made = 0
    for rj in js["spec"]["replicatedJobs"]:
        for i in range(int(rj["replicas"])):
            job = build_job(js, rj, i, attempt=999, global_index=made)
            made += 1
            out += v.problems(job)
            out += v.problems(build_pod(job, int(job["spec"]["completions"]) - 1))
    return out


def _sweep():
    for family in tputypes.families():
        for tpu_type in {"v5litepod": ["v5litepod-1", "v5litepod-16", "v5litepod-256"],
                         "v6e": ["v6e-1", "v6e-16", "v6e-256"], "v4": ["v4-8", "v4-32", "v4-4096"],
                         "v5p": ["v5p-8", "v5p-32", "v5p-8192"], "tpu7x": ["tpu7x-2", "tpu7x-16", "tpu7x-8192"]
                         }[family]:
            multi = tputypes.shape(tpu_type).hosts > 1
            for slices in (1, 2, 3, 4) if multi else (1,):
                for queue, priority in (("", ""), (LONGEST_QUEUE, "very-high"), ("lq", "p" * 253)):
                    yield tpu_type, slices, queue, priority


@pytest.mark.parametrize("tpu_type,slices,queue,priority", list(_sweep()))
def test_every_manifest_tpuctl_makes_and_all_it_derives_is_valid(tpu_type, slices, queue, priority):
    js = manifest.build_jobset(_run(tpu_type, slices, queue, priority))
    assert _derived_problems(js) == []
    if slices > 1:   # every pod of every slice has a coordinator address, the same one
        env = {e["name"]: e for e in js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
               ["containers"][0]["env"]}
        address = env["MEGASCALE_COORDINATOR_ADDRESS"]["value"]
        assert address == f"tpuctl-{RUN_ID}-slice-0-0.tpuctl-{RUN_ID}"
        job0 = build_job(dict(js, metadata={**js["metadata"], "uid": "u"}), js["spec"]["replicatedJobs"][0], 0, 0, 0)
        pod0 = build_pod(job0, 0)
        # the DNS name of slice 0's worker 0: <hostname>.<subdomain>, each a DNS-1123 label
        assert address == f"{pod0['spec']['hostname']}.{pod0['spec']['subdomain']}"


def test_the_dry_runs_manifest_is_valid_at_the_real_length():
    *rbac, js = dryrun.objects(LONGEST_CLUSTER, "v5litepod-16", 4, 3, queue=LONGEST_QUEUE, priority="high")
    assert dryrun.DRY_RUN_ID.lower() in js["metadata"]["name"] and _derived_problems(js) == []
    assert [o["kind"] for o in rbac] == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    assert [p for o in rbac for p in v.problems(o)] == []   # the cordon account and role's names, at the longest


def test_the_queue_objects_up_makes_are_valid_against_kueues_crds():
    crds = {o["metadata"]["name"]: o for o in kueue_install.release_objects() if o["kind"] == "CustomResourceDefinition"}
    from tpuctl.providers.gke import schema
    for tpu_type in ("v6e-16", "tpu7x-16", "v5p-8"):
        for obj in kueue_install.queue_objects(tputypes.shape(tpu_type), 4):
            plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
                      "LocalQueue": "localqueues"}.get(obj["kind"])
            crd = schema.version_schema(crds[f"{plural}.kueue.x-k8s.io"], "v1beta1") if plural else None
            assert v.problems(obj, crd) == [], obj["kind"]


def _old_coordinator(js):
    """The JobSet as tpuctl made it before issue 57: spec.coordinator set."""
    js = copy.deepcopy(js)
    js["spec"]["coordinator"] = {"replicatedJob": manifest.REPLICATED_JOB, "jobIndex": 0, "podIndex": 0}
    return js


def test_the_sweep_catches_the_73_character_coordinator_label():
    js = _old_coordinator(manifest.build_jobset(_run("v6e-16", 2)))
    found = _derived_problems(js)
    assert len(OLD_COORDINATOR) == 73
    assert found and all(f"{OLD_COORDINATOR!r}: must be no more than 63 characters" in p for p in found)


@pytest.fixture
def kube_with_jobset(tmp_path):
    fake = FakeKube()
    fake.put(CRD_PREFIX + JOBSET_CRD, copy.deepcopy(jobset_install.release_crd()))
    cluster = FakeCluster(fake, {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)})
    yield fake, cluster
    cluster.stop()
    fake.stop()


def _apply(fake, js):
    from tpuctl.providers.gke import kube
    api = kube.connect(fake.url, "", "")
    kube.apply(api, f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{js['metadata']['name']}", js)


def test_the_fakes_jobset_controller_cannot_make_jobs_with_the_old_coordinator_label(kube_with_jobset, monkeypatch):
    """Today's fake on the old manifest: the JobSet is accepted (v0.10.1's webhook does not check the coordinator),
    and every Job's create is refused, with no condition on the JobSet: the run never starts."""
    monkeypatch.setenv("CONTAINER_EMULATOR_HOST", "fake")
    fake, cluster = kube_with_jobset
    js = _old_coordinator(manifest.build_jobset(_run("v6e-8", 2)))
    _apply(fake, js)
    until(lambda: len(cluster.refused) == 2, 10, "both Jobs refused")
    assert not [p for p in fake.objects if "/jobs/" in p or "/pods/" in p]
    assert all(f"{OLD_COORDINATOR!r}: must be no more than 63 characters" in m for m in cluster.refused.values())
    stored = fake.objects[f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{js['metadata']['name']}"]
    assert stored["status"].get("conditions") == []


def test_the_fakes_jobset_controller_makes_the_new_manifests_jobs_and_pods(kube_with_jobset, monkeypatch):
    monkeypatch.setenv("CONTAINER_EMULATOR_HOST", "fake")
    fake, cluster = kube_with_jobset
    js = manifest.build_jobset(_run("v6e-8", 2))
    _apply(fake, js)
    until(lambda: len([p for p in fake.objects if "/pods/" in p]) == 4, 10, "4 pods")
    assert cluster.refused == {}
    pods = [o for p, o in fake.objects.items() if "/pods/" in p]
    assert {p["spec"]["hostname"] for p in pods} == {f"tpuctl-{RUN_ID}-slice-{j}-{k}" for j in (0, 1) for k in (0, 1)}
    assert {p["spec"]["subdomain"] for p in pods} == {f"tpuctl-{RUN_ID}"}


def test_the_fake_api_server_refuses_an_invalid_object(kube_with_jobset, monkeypatch):
    from tpuctl.providers.gke import kube
    monkeypatch.setenv("CONTAINER_EMULATOR_HOST", "fake")
    fake, _ = kube_with_jobset
    js = manifest.build_jobset(_run("v6e-16", 1))
    js["metadata"]["labels"]["tpuctl-run"] = "x" * 64
    with pytest.raises(kube.KubeError, match="must be no more than 63 characters"):
        _apply(fake, js)
    js = manifest.build_jobset(_run("v6e-16", 1, run_id="20261129-100312-123-ab12" + "9" * 20))
    with pytest.raises(kube.KubeError, match="vjobset.kb.io"):   # the webhook: pod names over 63
        _apply(fake, js)


def test_queue_names_longer_than_a_label_value_are_refused_offline():
    from tpuctl.core.errors import TpuctlError
    from tpuctl.providers.gke import kueue
    assert kueue.check_name(LONGEST_QUEUE, "--queue") == LONGEST_QUEUE
    with pytest.raises(TpuctlError, match="invalid --queue"):
        kueue.check_name(LONGEST_QUEUE + "q", "--queue")


def _release_into(fake, objects):
    """A release's objects stored as `kubectl apply` leaves them, its controller not (yet, or no longer) Available."""
    from tpuctl.providers.gke import kueue_install as ki
    for obj in objects:
        fake.put(ki._path(obj), copy.deepcopy(obj))


def test_the_shipped_kueue_runs_the_jobset_integration_alone():
    """Issue 57 item 5: the Kueue tpuctl installs enables the JobSet integration only and registers no webhook on
    pods, Deployments, StatefulSets or Jobs: with its one replica down, nothing else in the cluster is refused."""
    import yaml
    objs = kueue_install.release_objects()
    (config,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "kueue-manager-config"]
    manager = yaml.safe_load(config["data"]["controller_manager_config.yaml"])
    assert manager["integrations"]["frameworks"] == ["jobset.x-k8s.io/jobset"]
    hooks = [h for o in objs if o["kind"].endswith("WebhookConfiguration") for h in o["webhooks"]]
    assert sorted(h["name"] for h in hooks) == sorted(
        f"{p}{k}.kb.io" for p, k in [("m", "clusterqueue"), ("m", "jobset"), ("m", "resourceflavor"),
                                     ("m", "workload"), ("v", "clusterqueue"), ("v", "cohort"), ("v", "jobset"),
                                     ("v", "resourceflavor"), ("v", "workload")])
    covered = {r for h in hooks for rule in h["rules"] for r in rule["resources"]}
    assert not covered & {"pods", "deployments", "statefulsets", "jobs"}, covered


def test_with_kueue_down_a_pod_in_any_namespace_is_still_created(tmp_path):
    fake = FakeKube()
    try:
        _release_into(fake, kueue_install.release_objects())   # Kueue's controller never Available
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
               "spec": {"containers": [{"name": "c", "image": "i"}]}}
        fake.create("/api/v1/namespaces/team-a/pods/p", copy.deepcopy(pod))
        # the release as Kueue publishes it (its pod webhook, failurePolicy Fail) refuses it: what the fake models
        from fakes.k8s_server import Invalid
        released = copy.deepcopy([o for o in kueue_install.release_objects()
                                  if o["kind"] == "MutatingWebhookConfiguration"][0])
        released["webhooks"].append({"name": "mpod.kb.io", "failurePolicy": "Fail", "clientConfig": {"service": {
            "name": "kueue-webhook-service", "namespace": "kueue-system", "path": "/mutate--v1-pod"}},
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                        "values": ["kube-system", "kueue-system"]}]},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]})
        fake.put("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                 "kueue-mutating-webhook-configuration", released)
        with pytest.raises(Invalid, match='failed calling webhook "mpod.kb.io"'):
            fake.create("/api/v1/namespaces/team-a/pods/q", dict(copy.deepcopy(pod), metadata={
                "name": "q", "namespace": "team-a"}))
        fake.create("/api/v1/namespaces/kube-system/pods/q", dict(copy.deepcopy(pod), metadata={
            "name": "q", "namespace": "kube-system"}))   # its namespaceSelector leaves kube-system out
    finally:
        fake.stop()


@pytest.mark.parametrize("tpu_type,slices", [("v6e-16", 4), ("tpu7x-8192", 4), ("v5litepod-1", 1)])
def test_a_workload_priority_class_manifest_is_valid_at_the_longest_names(tpu_type, slices):
    import dataclasses
    r = dataclasses.replace(_run(tpu_type, slices, LONGEST_QUEUE, "w" * 63), workload_priority=True)
    js = manifest.build_jobset(r)
    assert js["metadata"]["labels"][manifest.WORKLOAD_PRIORITY_LABEL] == "w" * 63
    assert _derived_problems(js) == []
