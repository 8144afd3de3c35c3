"""Issue 57 item 6, xpk's node-pool options (container.build_node_pool, compared with xpk's core/nodepool.py):
gVNIC on every pool, at most 15 pods per node on a multi-host TPU pool where the cluster is VPC-native (GKE allows
the setting there only: the fake refuses it elsewhere), and no host maintenance interval, a v1beta1 field the v1
API tpuctl speaks does not have (the fake refuses unknown fields as Google's APIs do)."""
from __future__ import annotations

from fakes import gke_server
from test_gke_flow import _gke_servers, _their_cluster, _up, gke  # noqa: F401  (fixtures)


def test_a_multi_host_pool_gets_gvnic_and_xpks_max_pods(gke, cli):
    code, out, err = _up(cli, "po", "--type", "v6e-16", "--zone", "us-east5-b")
    assert code == 0, err
    pool = gke.pool("tpuctl-po-np-0")
    assert pool["config"]["gvnic"] == {"enabled": True}
    assert pool["maxPodsConstraint"] == {"maxPodsPerNode": "15"}
    assert cli("down", "-c", "po", "--yes")[0] == 0


def test_a_single_host_pool_gets_gvnic_and_gkes_default_max_pods(gke, cli):
    code, out, err = _up(cli, "ps", "--type", "v6e-4", "--zone", "us-east5-b")
    assert code == 0, err
    pool = gke.pool("tpuctl-ps-np-0")
    assert pool["config"]["gvnic"] == {"enabled": True} and "maxPodsConstraint" not in pool
    assert cli("down", "-c", "ps", "--yes")[0] == 0


def test_an_adopted_routes_based_cluster_gets_no_max_pods(gke, cli):
    _their_cluster(gke)   # no ipAllocationPolicy: routes-based
    code, out, err = _up(cli, "pr", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team")
    assert code == 0, err
    assert "maxPodsConstraint" not in gke.pool("tpuctl-pr-np-0")
    assert cli("down", "-c", "pr", "--yes")[0] == 0
    _their_cluster(gke, name="vpc")
    gke.fake.clusters[("test-proj", "us-east5", "vpc")]["ipAllocationPolicy"] = {"useIpAliases": True}
    code, out, err = _up(cli, "pv", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "vpc")
    assert code == 0, err
    assert gke.pool("tpuctl-pv-np-0")["maxPodsConstraint"] == {"maxPodsPerNode": "15"}
    assert cli("down", "-c", "pv", "--yes")[0] == 0


def test_the_fake_refuses_what_the_v1_api_lacks_or_refuses():
    assert gke_server._unknown_fields({"name": "p", "config": {"hostMaintenancePolicy": {
        "maintenanceInterval": "AS_NEEDED"}}}) == ("Invalid JSON payload received. Unknown name "
                                                   "\"hostMaintenancePolicy\" at 'node_pool.config': Cannot find field.")
    assert gke_server._unknown_fields({"name": "p", "maxPodsConstraint": {"maxPodsPerNode": "15"},
                                       "config": {"gvnic": {"enabled": True}}}) == ""
    fake = gke_server.FakeGke()
    pool = {"maxPodsConstraint": {"maxPodsPerNode": "15"}}
    assert "VPC-native" in fake._refuse_pool_options({}, pool)
    assert fake._refuse_pool_options({"ipAllocationPolicy": {"useIpAliases": True}}, pool) == ""
