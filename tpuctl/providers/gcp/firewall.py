"""The network's firewall between a cluster's hosts (issue 39 item 3): `up --network` of a multi-host cluster.

A multi-host run's processes reach each other over the VPC: JAX's coordinator (8482; jax/_src/clusters/
cloud_tpu_cluster.py `coordinator_port`), the megascale coordinator of a Multislice (8080 in Google's tpu-env, "the
MXLA coordinator, which is set to 8080 in multislice GCE", same file; 8081 where tpuctl sets it, core/multislice.py)
and TensorFlow's TPU workers on a pod (8470-8476). The default network comes with `default-allow-internal`, any other
only the implied rules, which deny all ingress (cloud.google.com/vpc/docs/firewalls, "Implied rules": "implied deny
ingress rule"; "Pre-populated rules in the default network": default-allow-internal). Without a rule the first run
hangs at start-up, so `up` checks the network's rules (firewalls.list, read-only) and refuses, naming the rule to
add, unless `--create-firewall` lets it make one; `down` removes what it made.

A Firewall resource has no labels (cloud.google.com/compute/docs/reference/rest/v1/firewalls: name, network,
direction, priority, sourceRanges, sourceTags, targetTags, targetServiceAccounts, allowed[].IPProtocol/ports,
disabled, description): the rule tpuctl makes is known by its name, `tpuctl-<cluster>-internal`, and proves it is
ours by its description, `tpuctl-cluster=<cluster>`. Firewall operations are global (globalOperations.get)."""
from __future__ import annotations

import ipaddress
from typing import Any

from ...core.errors import ErrorKind, TpuctlError, bad_input
from ...core.models import LABEL, ClusterSpec
from ..base import Progress
from ..google import clients
from ..google.operations import call
from ..google.vms import wait_operation

PORTS = ((8080, 8081), (8470, 8476), (8482, 8482))   # inclusive ranges
PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]


def applies(spec: ClusterSpec, hosts: int) -> bool:
    """A network of the user's own, and hosts that talk to each other (several slices, or a multi-host slice)."""
    return bool(spec.network) and spec.network != "default" and (spec.slices > 1 or hosts > 1)


def rule_name(spec: ClusterSpec) -> str:
    return f"tpuctl-{spec.name}-internal"


def _ports() -> list[str]:
    return [f"{a}-{b}" if a != b else str(a) for a, b in PORTS]


def gcloud_command(spec: ClusterSpec) -> str:
    return (f"gcloud compute firewall-rules create {rule_name(spec)} --project {spec.project} --network "
            f"{spec.network} --direction INGRESS --source-ranges {','.join(map(str, PRIVATE))} --allow "
            + ",".join(f"tcp:{p}" for p in _ports()))


def _covers(rule: Any, network: str) -> set[tuple[int, int]]:
    """The needed port ranges this rule lets in from the hosts' private addresses to every instance."""
    if rule.network.rsplit("/", 1)[-1] != network or rule.disabled or (rule.direction or "INGRESS") != "INGRESS":
        return set()
    if list(rule.target_tags) or list(rule.target_service_accounts):
        return set()   # applies to tagged instances only; tpuctl's TPU VMs carry no tags
    try:
        sources = [ipaddress.ip_network(r, strict=False) for r in rule.source_ranges]
    except ValueError:
        return set()
    if not any(s.overlaps(p) for s in sources for p in PRIVATE):
        return set()
    covered: set[tuple[int, int]] = set()
    for allow in rule.allowed:
        proto = allow.I_p_protocol.lower()
        if proto not in ("all", "tcp", "6"):
            continue
        spans = [tuple(map(int, (p.split("-") * 2)[:2])) for p in allow.ports] or [(0, 65535)]
        covered |= {need for need in PORTS if any(lo <= need[0] and need[1] <= hi for lo, hi in spans)}
    return covered


def missing(spec: ClusterSpec) -> list[str]:
    """The needed port ranges no rule of the network opens between its hosts ([] when all are open)."""
    rules = call(clients.compute("FirewallsClient").list, project=spec.project,
                 what=f"list the firewall rules of network {spec.network}")
    covered: set[tuple[int, int]] = set()
    for rule in rules:
        covered |= _covers(rule, spec.network)
    return [p for p, need in zip(_ports(), PORTS) if need not in covered]


def check(spec: ClusterSpec, hosts: int) -> None:
    """`up`'s check, before anything is made: refused in one line naming the rule, unless --create-firewall."""
    if not applies(spec, hosts) or spec.create_firewall:
        return
    lacking = missing(spec)
    if lacking:
        raise bad_input(f"--network {spec.network}: no firewall rule lets the cluster's hosts reach each other on "
                        f"tcp {', '.join(lacking)} (JAX, megascale, TensorFlow); the first run would hang",
                        f"add it: {gcloud_command(spec)}; or pass --create-firewall to have tpuctl make it "
                        "(down removes it)")


def ensure(spec: ClusterSpec, hosts: int, progress: Progress) -> None:
    """The rule `--create-firewall` asked for, made unless the network already lets the hosts in (adopted: a 409)."""
    if not applies(spec, hosts) or not spec.create_firewall or not missing(spec):
        return
    from google.cloud import compute_v1
    body = compute_v1.Firewall(
        name=rule_name(spec), network=f"projects/{spec.project}/global/networks/{spec.network}",
        direction="INGRESS", priority=1000, source_ranges=[str(p) for p in PRIVATE],
        allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=_ports())],
        description=f"{LABEL}={spec.name}: lets the cluster's TPU hosts reach each other")
    progress("creating")
    what = f"create firewall rule {rule_name(spec)}"
    try:
        wait_operation(spec.project, call(clients.compute("FirewallsClient").insert_unary, project=spec.project,
                                 firewall_resource=body, what=what), what)
    except TpuctlError as e:
        from google.api_core.exceptions import Conflict
        if not isinstance(e.__cause__, Conflict):
            raise


def delete(spec: ClusterSpec, progress: Progress) -> None:
    """`down`: the rule `up --create-firewall` made, if it is there and says it is this cluster's."""
    if not spec.create_firewall:
        return
    from google.api_core.exceptions import NotFound
    client = clients.compute("FirewallsClient")
    try:
        rule = client.get(project=spec.project, firewall=rule_name(spec))
    except NotFound:
        return
    if rule.description.split(":", 1)[0] != f"{LABEL}={spec.name}":
        raise TpuctlError(ErrorKind.INPUT, f"firewall rule {rule_name(spec)} is not cluster {spec.name}'s",
                          "remove it yourself if it should go")
    progress("deleting")
    what = f"delete firewall rule {rule_name(spec)}"
    wait_operation(spec.project, call(client.delete_unary, project=spec.project, firewall=rule_name(spec), what=what), what)
