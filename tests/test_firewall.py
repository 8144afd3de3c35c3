"""`up --network` of a multi-host cluster and the network's firewall (issue 39 item 3; providers/gcp/firewall.py),
against the fake Compute API's firewalls.list / get / insert / delete (tests/fakes/compute_server.py)."""
import pytest

from conftest import PROJECT

ZONE = "us-central2-b"
UP = ("up", "--type", "v4-16", "--zone", ZONE, "--slices", "2", "--framework", "jax", "--network", "lab", "--yes")


def _made(cloud):
    return [c for c in cloud.tpu.calls if c[1].startswith("Create")] + cloud.compute.mutating_calls()


def test_a_network_without_the_rule_is_refused_in_one_line_before_anything_is_made(cloud, cli):
    cloud.compute.add_network(PROJECT, "lab")
    code, out, err = cli(*UP, "-c", "fw")
    assert code == 2, err
    assert "--network lab: no firewall rule lets the cluster's hosts reach each other on tcp 8080-8081, " \
           "8470-8476, 8482" in err
    assert f"gcloud compute firewall-rules create tpuctl-fw-internal --project {PROJECT} --network lab " \
           "--direction INGRESS" in err and "--create-firewall" in err
    assert "Traceback" not in err and _made(cloud) == []


def test_create_firewall_makes_the_rule_and_down_removes_it(cloud, cli):
    cloud.compute.add_network(PROJECT, "lab")
    code, out, err = cli(*UP, "-c", "fw", "--create-firewall")
    assert code == 0, err
    rule = cloud.compute.firewalls[(PROJECT, "tpuctl-fw-internal")]
    assert rule["network"].endswith(f"projects/{PROJECT}/global/networks/lab")
    assert rule["description"].startswith("tpuctl-cluster=fw:")
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["8080-8081", "8470-8476", "8482"]}]
    assert cli(*UP, "-c", "fw")[0] == 0                              # up again: the rule is there, nothing asked
    assert cli("down", "-c", "fw", "--yes")[0] == 0
    assert cloud.compute.firewalls == {}


@pytest.mark.parametrize("rule, ok", [
    ({"IPProtocol": "all"}, True),
    ({"IPProtocol": "tcp", "ports": ["0-65535"]}, True),
    ({"IPProtocol": "tcp", "ports": ["8470-8476"]}, False),         # JAX's and megascale's ports still closed
    ({"IPProtocol": "udp", "ports": ["0-65535"]}, False),
], ids=["all", "tcp", "tf-only", "udp"])
def test_a_rule_of_the_users_own_is_read_for_the_ports_it_opens(cloud, cli, rule, ok):
    cloud.compute.add_network(PROJECT, "lab")
    cloud.compute.firewalls[(PROJECT, "lab-internal")] = {
        "name": "lab-internal", "network": f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/global/networks/lab",
        "direction": "INGRESS", "sourceRanges": ["10.0.0.0/16"], "allowed": [rule], "disabled": False}
    code, out, err = cli(*UP, "-c", "fw")
    assert (code == 0) is ok, err
    assert (cloud.compute.mutating_calls() == []) or not ok           # a user's rule is never made or touched
    if ok:
        assert cli("down", "-c", "fw", "--yes")[0] == 0
        assert (PROJECT, "lab-internal") in cloud.compute.firewalls


def test_the_default_network_and_one_host_are_not_checked(cloud, cli):
    code, out, err = cli("up", "--type", "v4-8", "--zone", ZONE, "--framework", "jax", "--network", "lab", "-c",
                         "one", "--yes")
    assert code == 0, err
    assert not [c for c in cloud.compute.calls if c[0].startswith("fw_")]
    assert cli("down", "-c", "one", "--yes")[0] == 0
