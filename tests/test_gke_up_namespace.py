"""Issue 57 item 3, `up --namespace NAME`: the namespace is made when missing (the API server refuses an object in a
namespace that does not exist: the fake's NamespaceLifecycle), `up --kueue`'s LocalQueue goes in it, the cluster
remembers it so that `submit` and its dry run default to it (an explicit `--namespace` still wins), and `down` of an
adopted cluster removes it only if `up` made it. Item 2: the ResourceFlavor `up --kueue` makes names tpuctl's own
node label and tolerates its taint."""
from __future__ import annotations

from tpuctl.core import state

from test_gke_flow import _gke_servers, _their_cluster, _up, gke  # noqa: F401  (fixtures)

NS = "/api/v1/namespaces/team-a"
LQ = "/apis/kueue.x-k8s.io/v1beta1/namespaces/team-a/localqueues/multislice-queue"
FLAVOR = "/apis/kueue.x-k8s.io/v1beta1/resourceflavors/tpuctl-tpu-v6e-slice-4x4"


def test_up_namespace_kueue_puts_the_localqueue_in_a_namespace_it_makes(gke, cli):
    code, out, err = _up(cli, "nq", "--type", "v6e-16", "--zone", "us-east5-b", "--kueue", "--namespace", "team-a")
    assert code == 0, err
    objs = gke.kube.objects
    assert objs[NS]["metadata"]["labels"] == {"tpuctl-cluster": "nq"}
    assert objs[LQ]["spec"] == {"clusterQueue": "cluster-queue"}
    assert not [p for p in objs if "/namespaces/default/localqueues/" in p]
    said = " ".join(err.split())
    assert "namespace team-a made" in said and "LocalQueue team-a/multislice-queue" in said, said
    assert state.load("nq").spec.namespace == "team-a"
    code, out, err = cli("status", "-c", "nq")
    assert "team-a" in out + err   # `status` says where the runs go
    code, out, err = _up(cli, "nq", "--namespace", "team-b")   # its LocalQueue is in team-a: not moved
    assert code == 2 and "was made with --namespace team-a" in err, err
    assert cli("down", "-c", "nq", "--yes")[0] == 0
    assert gke.leaks() == []


def test_the_resourceflavor_names_tpuctls_own_nodes_and_tolerates_their_taint(gke, cli):
    code, out, err = _up(cli, "rf", "--type", "v6e-16", "--zone", "us-east5-b", "--kueue")
    assert code == 0, err
    spec = gke.kube.objects[FLAVOR]["spec"]   # through the fake's validation against the shipped CRD's schema
    assert spec["nodeLabels"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                  "cloud.google.com/gke-tpu-topology": "4x4", "tpuctl-cluster": "rf"}
    assert spec["tolerations"] == [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},
                                   {"key": "tpuctl-cluster", "operator": "Equal", "value": "rf",
                                    "effect": "NoSchedule"}]
    pool = gke.pool("tpuctl-rf-np-0")["config"]   # what the flavor names is what the node pool carries
    assert pool["labels"]["tpuctl-cluster"] == "rf"
    assert [(t["key"], t["value"]) for t in pool["taints"]] == [("tpuctl-cluster", "rf")]
    assert state.load("rf").spec.namespace == ""   # no --namespace: default, as before
    assert "/apis/kueue.x-k8s.io/v1beta1/namespaces/default/localqueues/multislice-queue" in gke.kube.objects
    assert cli("down", "-c", "rf", "--yes")[0] == 0


def test_down_of_an_adopted_cluster_removes_only_the_namespace_up_made(gke, cli):
    _their_cluster(gke)
    gke.kube.put("/api/v1/namespaces/theirs", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": "theirs"}})
    for name, ns in (("a1", "team-a"), ("a2", "theirs")):
        code, out, err = _up(cli, name, "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team",
                             "--namespace", ns)
        assert code == 0, err
    assert "namespace theirs found" in " ".join(err.split())
    assert "/apis/kueue.x-k8s.io/v1beta1/namespaces/team-a/localqueues/multislice-queue" not in gke.kube.objects
    code, out, err = cli("down", "-c", "a2", "--yes")
    assert code == 0 and "namespace theirs kept (it was there before tpuctl)" in " ".join(err.split()), err
    assert "/api/v1/namespaces/theirs" in gke.kube.objects
    code, out, err = cli("down", "-c", "a1", "--yes")
    assert code == 0 and "namespace team-a deleted" in " ".join(err.split()), err
    assert NS not in gke.kube.objects and gke.leaks() == []


def test_down_keeps_a_namespace_up_made_while_it_holds_pods_not_tpuctls(gke, cli):
    _their_cluster(gke)
    code, out, err = _up(cli, "a3", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team",
                         "--namespace", "team-a")
    assert code == 0, err
    gke.kube.put(f"{NS}/pods/web", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web", "namespace": "team-a", "labels": {"app": "web"}}})
    code, out, err = cli("down", "-c", "a3", "--yes")
    assert code == 0 and "namespace team-a kept (it holds 1 pod not tpuctl's)" in " ".join(err.split()), err
    assert NS in gke.kube.objects and f"{NS}/pods/web" in gke.kube.objects


def test_a_namespace_made_by_an_up_that_failed_later_is_removed(gke, cli, monkeypatch):
    from tpuctl.providers.gke import provider

    def fail(st):
        raise provider.TpuctlError(provider.ErrorKind.ERROR, "Kueue could not be installed", "")
    monkeypatch.setattr(provider, "install_kueue", fail)
    _their_cluster(gke)
    code, out, err = _up(cli, "a4", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team",
                         "--namespace", "team-a", "--kueue")
    assert code != 0 and "Kueue could not be installed" in err, err
    assert NS not in gke.kube.objects and gke.leaks() == []


def test_the_fake_refuses_an_object_in_a_namespace_that_does_not_exist(gke):
    from tpuctl.providers.gke import kube
    api = kube.connect(gke.kube.url, "", "")
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "nowhere"}}
    try:
        kube.apply(api, "/api/v1/namespaces/nowhere/configmaps/x", obj)
        raise AssertionError("applied in a namespace that does not exist")
    except kube.KubeError as e:
        assert e.status == 404 and e.message == 'namespaces "nowhere" not found'



def test_a_namespace_the_cluster_refuses_to_make_is_one_line_and_up_is_undone(gke, cli):
    _their_cluster(gke)
    gke.kube.faults.append(("PATCH", "/api/v1/namespaces/team-a", 403, 'namespaces is forbidden: User "me" cannot '
                                                                       'create resource "namespaces"'))
    code, out, err = _up(cli, "a5", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team",
                         "--namespace", "team-a")
    assert code != 0 and "namespace team-a: namespaces is forbidden" in " ".join(err.split()), err
    assert "Traceback" not in err and gke.leaks() == []
