"""Issue 49 item 8: a cluster whose IP endpoints are off is reached on its DNS endpoint, with the same Google token
and no cluster CA, as gcloud's get-credentials does (googlecloudsdk api_lib/container/util.py _GetClusterEndpoint,
kubeconfig.py Cluster); the fake answers such a cluster only there (fakes/gke_server.py `dns_only`)."""
from __future__ import annotations

from test_gke_flow import PROJ, _their_cluster, _up, gke, _gke_servers  # noqa: F401  (fixtures)
from tpuctl.core import state


def test_an_adopted_cluster_without_ip_endpoints_is_reached_on_its_dns_endpoint(gke, cli):
    _their_cluster(gke)
    team = gke.fake.dns_only(gke.fake.clusters[(PROJ, "us-east5", "team")])
    code, out, err = _up(cli, "dns", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team")
    assert code == 0, err
    assert "jobset team  installed v0.10.1" in err   # JobSet went in through the DNS endpoint
    assert gke.installed[0] == {"endpoint": gke.kube.url, "ca": "", "token": ""}
    assert state.load("dns").record["gke"]["endpoint"] == gke.kube.url != team["endpoint"]
    assert cli("down", "-c", "dns", "--yes")[0] == 0
    assert gke.leaks() == []


def test_a_dns_endpoint_that_refuses_outside_traffic_is_one_clear_error_and_nothing_is_left(gke, cli):
    _their_cluster(gke)
    gke.fake.dns_only(gke.fake.clusters[(PROJ, "us-east5", "team")], allow_external=False)
    code, out, err = _up(cli, "dns", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team")
    assert code == 2, err
    said = " ".join(err.split())
    assert "its DNS endpoint refuses outside traffic" in said and "--enable-dns-access" in said
    assert "Traceback" not in err and gke.leaks() == [] and state.load("dns") is None


def test_a_cluster_whose_public_ip_endpoint_is_off_is_reached_on_its_dns_endpoint(gke, cli):
    # issue 57 item 6: enable_public_endpoint false leaves only a private IP, not reachable from here
    _their_cluster(gke)
    gke.fake.dns_only(gke.fake.clusters[(PROJ, "us-east5", "team")],
                      ip_config={"enabled": True, "enablePublicEndpoint": False})
    code, out, err = _up(cli, "pub", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team")
    assert code == 0, err
    assert state.load("pub").record["gke"]["endpoint"] == gke.kube.url
    assert cli("down", "-c", "pub", "--yes")[0] == 0


def test_an_ip_endpoints_config_without_enabled_is_not_read_as_off():
    from google.cloud import container_v1 as c
    from tpuctl.providers.gke import container
    cluster = c.Cluster(name="x", endpoint="34.1.2.3", master_auth=c.MasterAuth(cluster_ca_certificate="Q0E="),
                        control_plane_endpoints_config=c.ControlPlaneEndpointsConfig(
                            ip_endpoints_config=c.ControlPlaneEndpointsConfig.IPEndpointsConfig(global_access=True),
                            dns_endpoint_config=c.ControlPlaneEndpointsConfig.DNSEndpointConfig(
                                endpoint="uid.us-central1.gke.goog")))
    assert container.api_endpoint(cluster) == ("34.1.2.3", "Q0E=")
