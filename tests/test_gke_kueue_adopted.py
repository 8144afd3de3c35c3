"""Issue 49 item 10, "(or adopts, when the user asks)": `up --gke-cluster C --kueue` installs Kueue in an adopted
cluster that has none (the user's `--kueue` is the ask), applies nothing to one that has its own (its
`cluster-queue` may be xpk's, whose quota ours would replace), and `down` never removes an adopted cluster's
Kueue, whoever installed it."""
from __future__ import annotations

from test_gke_flow import _their_cluster, _up, gke, _gke_servers  # noqa: F401  (fixtures)
from tpuctl.providers.gke import kueue_install

CQ = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues/cluster-queue"


def test_kueue_goes_into_an_adopted_cluster_without_one_and_stays_after_down(gke, cli):
    _their_cluster(gke)
    code, out, err = _up(cli, "ak", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team", "--kueue")
    assert code == 0, err
    said = " ".join(err.split())
    assert "installed in the adopted cluster only if it has no Kueue" in said and "kueue team installed v0.17.8" in said
    assert kueue_install.CRD_PATH in gke.kube.objects and CQ in gke.kube.objects
    code, out, err = cli("down", "-c", "ak", "--yes")
    assert code == 0, err
    assert "kept (adopted cluster: others may queue on it)" in " ".join(err.split())
    assert gke.leaks() == []
    assert kueue_install.CRD_PATH in gke.kube.objects and CQ in gke.kube.objects   # still there


def test_an_adopted_clusters_own_kueue_is_left_as_it_is(gke, cli):
    _their_cluster(gke)
    theirs = {"kind": "ClusterQueue", "metadata": {"name": "cluster-queue"}, "spec": {"resourceGroups": [
        {"coveredResources": ["google.com/tpu"], "flavors": [{"name": "2xv6e-16", "resources": [
            {"name": "google.com/tpu", "nominalQuota": 64}]}]}]}}
    gke.kube.put(kueue_install.CRD_PATH, {"kind": "CustomResourceDefinition",
                                          "metadata": {"name": "workloads.kueue.x-k8s.io"}})
    gke.kube.put(CQ, theirs)
    before = len(gke.kube.requests)
    code, out, err = _up(cli, "ak", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team", "--kueue")
    assert code == 0, err
    assert "found (the cluster's own, left as it is" in " ".join(err.split())
    assert gke.kube.objects[CQ]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == 64
    assert not [r for r in gke.kube.requests[before:] if r[0] in ("PATCH", "PUT", "POST") and "kueue" in r[1]]
    assert cli("down", "-c", "ak", "--yes")[0] == 0
    assert gke.leaks() == [] and CQ in gke.kube.objects
