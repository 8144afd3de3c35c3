"""A sick host on GKE (issue 60 item 4): the pod's agent cordons its node (host/cordon.py, kubectl cordon's patch)
and exits for a JobSet restart; the scheduler passes the cordoned node over, the run resumes on another node and
succeeds. The pods run as an account of the cluster's bound to a ClusterRole that may get and patch nodes
(providers/gke/cordoning.py), which `down` deletes. Against the Kubernetes fake and its kubelet (test_gke_runs.py's
`gke` fixture: the agent wheel from the fake bucket, run as each pod's command)."""
import json
import socket

import pytest

from tpuctl.core import layout, runs, state
from tpuctl.providers.gke import cordoning

from conftest import until
from jobs import make_job
from test_gke_runs import _ended, _jobset, _pod_logs, _run_ids, cluster_store, gke  # noqa: F401 - the fixture

SICK = "gke-tpuctl-gsick-np-0-0"
JOB = f"""
import os, sys
node = os.environ.get("TPUCTL_NODE", "?")
if node == {SICK!r}:   # its TPU held by a process that is not the job's: libtpu's words
    print("RuntimeError: The TPU is already in use by process with pid 4242. Not attempting to load libtpu.so")
    sys.exit(1)
print("trained on", node, "after", os.environ.get("TPUCTL_RESTARTS"), "restarts")
"""


@pytest.mark.slow(40)   # two pods, each installing the agent wheel
def test_a_sick_host_has_its_node_cordoned_and_the_run_resumes_on_another(gke, cli, tmp_path):
    fake, cluster, make = gke
    st = make("gsick", "v6e-1")
    _second_node_and_token(fake, cluster, tmp_path, "gsick")
    cluster.image_env.update(TPUCTL_LIBTPU_LOCKFILE=str(tmp_path / "libtpu_lockfile"), TPUCTL_RESTART_BACKOFF="0.1")
    code, out, err = cli("submit", str(make_job(tmp_path, JOB, 'framework = "jax"\n')), "-c", "gsick")
    assert code == 0, out + err + _pod_logs(fake)
    (run_id,) = _run_ids(fake)
    _ended(fake, run_id, "Completed")
    node = fake.objects[f"/api/v1/nodes/{SICK}"]
    assert node["spec"]["unschedulable"] is True, node
    assert "TPU is already in use" in node["metadata"]["annotations"][cordon_key()]
    assert ("PATCH", f"/api/v1/nodes/{SICK}") in fake.requests
    assert _jobset(fake, run_id)["status"]["restarts"] == 1   # one JobSet restart: exit 42 (RESTART_CODE)
    pod = next(o for p, o in fake.objects.items() if "/pods/" in p)
    assert pod["spec"]["nodeName"] == "gke-tpuctl-gsick-np-1-0"
    assert pod["spec"]["serviceAccountName"] == "tpuctl-gsick"
    assert "trained on gke-tpuctl-gsick-np-1-0 after 1 restarts" in out, out
    assert f"node {SICK} cordoned" in out and "the scheduler places it on another node" in out, out
    assert runs.status(cluster_store(), run_id).state is runs.RunState.SUCCEEDED
    assert cluster_store().read(layout.host_sick("x")) is None and not cluster_store().list(layout.SICK_PREFIX)
    # the account, its role (nodes: get, patch: what kubectl cordon calls) and the binding tpuctl applied
    role = fake.objects["/apis/rbac.authorization.k8s.io/v1/clusterroles/tpuctl-cordon-gsick"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    binding = fake.objects["/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/tpuctl-cordon-gsick-default"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tpuctl-gsick", "namespace": "default"}]
    assert "/api/v1/namespaces/default/serviceaccounts/tpuctl-gsick" in fake.objects
    # `down` deletes them with the JobSets (on an adopted cluster they would outlive it otherwise)
    from tpuctl.providers.gke.runs import GkeRuns
    GkeRuns().delete_all(state.load("gsick") or st, lambda _: None)
    assert not [p for p in fake.objects if "tpuctl-cordon" in p or p.endswith("/serviceaccounts/tpuctl-gsick")]


def _second_node_and_token(fake, cluster, tmp_path, name):
    cluster.add_node_pool(f"tpuctl-{name}-np-1", 1, {   # a second node of the shape, where the run can go
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "1x1",
        "tpuctl-cluster": name}, [{"key": "tpuctl-cluster", "value": name, "effect": "NoSchedule"}])
    sa = tmp_path / "serviceaccount"   # the token the kubelet mounts (the fake does not check it)
    sa.mkdir()
    (sa / "token").write_text("pod-token")
    cluster.image_env.update(TPUCTL_KUBE_API=fake.url, TPUCTL_KUBE_SA_DIR=str(sa))


@pytest.mark.slow(40)
def test_a_host_another_hosts_doctor_marked_sick_is_left_before_the_job_starts(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("gmark", "v6e-1")
    _second_node_and_token(fake, cluster, tmp_path, "gmark")
    host = socket.gethostname()   # the fake's pods all run here: the agent's host (TPUCTL_HOST unset)
    cluster_store().write(layout.host_sick(host), json.dumps({
        "host": host, "worker": 0, "why": "the run stalled twice in a row held back by this host alone"}).encode())
    body = "import os\nprint('trained on', os.environ.get('TPUCTL_NODE'), flush=True)\n"
    code, out, err = cli("submit", str(make_job(tmp_path, body, 'framework = "jax"\n')), "-c", "gmark")
    assert code == 0, out + err + _pod_logs(fake)
    (run_id,) = _run_ids(fake)
    _ended(fake, run_id, "Completed")
    assert fake.objects["/api/v1/nodes/gke-tpuctl-gmark-np-0-0"]["spec"]["unschedulable"] is True
    assert "trained on gke-tpuctl-gmark-np-1-0" in out and "trained on gke-tpuctl-gmark-np-0-0" not in out, out
    assert f"{host} is marked sick (the run stalled twice" in out and "node gke-tpuctl-gmark-np-0-0 cordoned" in out
    assert _jobset(fake, run_id)["status"]["restarts"] == 1
    assert cluster_store().read(layout.host_sick(host)) is None   # replaced: the mark goes, as the watcher's does


def cordon_key():
    from tpuctl.host.cordon import ANNOTATION
    return ANNOTATION


def test_a_cluster_that_refuses_the_role_runs_the_pods_on_the_default_account(gke, cli, tmp_path):
    fake, cluster, make = gke
    make("gdeny", "v6e-1")
    fake.faults.append(("PATCH", "/api/v1/namespaces/default/serviceaccounts/", 403,
                        'serviceaccounts is forbidden: User "u" cannot patch resource "serviceaccounts"'))
    code, out, err = cli("submit", str(make_job(tmp_path, "print('ok')\n", 'framework = "jax"\n')), "-c", "gdeny")
    assert code == 0, out + err + _pod_logs(fake)
    assert "a sick host's node will not be cordoned" in out + err, out + err
    pod = next(o for p, o in fake.objects.items() if "/pods/" in p)
    assert "serviceAccountName" not in pod["spec"]


def test_the_sick_mark_another_host_left_moves_the_pod_before_its_job_starts(tmp_path, monkeypatch):
    # a host marked sick by another host's run doctor (a stall alone, twice: doctor.py) is found at its pod's start
    from tpuctl.host import cordon
    from tpuctl.core.store import LocalStore
    store = LocalStore(str(tmp_path / "store"))
    monkeypatch.delenv("TPUCTL_NODE", raising=False)
    store.write(layout.host_sick("h1"), json.dumps({"host": "h1", "why": "stalled alone twice"}).encode())
    assert cordon.sick_here(store, "h1") == ""   # no GKE pod: nothing to cordon (the watcher's path)
    monkeypatch.setenv("TPUCTL_NODE", "n1")
    assert cordon.sick_here(store, "h1") == "stalled alone twice" and cordon.sick_here(store, "h2") == ""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("TPUCTL_KUBE_API", raising=False)
    moved, said = cordon.leave(store, "h1", "stalled alone twice")
    assert not moved and "could not be cordoned" in said and "KUBERNETES_SERVICE_HOST" in said
    assert store.read(layout.host_sick("h1")) is not None   # still marked: `status` says it
    from fakes.k8s_server import FakeKube   # and with the API: the node cordoned, the mark gone
    fake = FakeKube()
    try:
        fake.put("/api/v1/nodes/n1", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "spec": {}})
        (tmp_path / "token").write_text("t")
        monkeypatch.setenv("TPUCTL_KUBE_API", fake.url)
        monkeypatch.setenv("TPUCTL_KUBE_SA_DIR", str(tmp_path))
        moved, said = cordon.leave(store, "h1", "stalled alone twice")
        assert moved and "node n1 cordoned" in said and store.read(layout.host_sick("h1")) is None
        node = fake.objects["/api/v1/nodes/n1"]
        assert node["spec"]["unschedulable"] is True
        assert node["metadata"]["annotations"]["tpuctl-sick"] == "stalled alone twice"
        fake.objects.pop("/api/v1/nodes/n1")   # a node that is gone: refused, and said
        assert cordon.cordon("n1", "x").startswith("the Kubernetes API refused to cordon node n1: 404")
    finally:
        fake.stop()
