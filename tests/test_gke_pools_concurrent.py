"""Issue 49 item 8: `up --provider gke --slices N` makes its node pools at once, as xpk does (core/nodepool.py
run_commands(..., batch=100)), waits for all, raises the first failure in order, and leaves nothing made; a cluster
busy with another operation (GKE's own upgrade, or another pool's create where GKE runs one at a time) is waited
out, as GKE's concurrent-operations troubleshooting page says to. Runs under both of the fake's readings of GKE's
rule (test_gke_flow's `gke` fixture: "ops-queued", "one-op-per-cluster")."""
from __future__ import annotations

from test_gke_flow import PROJ, _their_cluster, _up, gke, _gke_servers  # noqa: F401  (fixtures)

_NO_ROOM = (8, "Google Compute Engine: ZONE_RESOURCE_POOL_EXHAUSTED: the zone does not have enough resources")


def _pool_ops(fake):
    """(started, ended) of each node pool create operation, in the order they were started."""
    ops = [o for o in fake.ops.values() if o["operationType"] == "CREATE_NODE_POOL"]
    return [(o["at"] - fake.delay, o["at"]) for o in ops]


def test_three_slices_make_their_node_pools_at_once(gke, cli):
    gke.fake.delay = 0.5
    code, out, err = _up(cli, "par", "--type", "v5litepod-16", "--zone", "us-west4-a", "--slices", "3")
    assert code == 0, err
    assert sorted(p["name"] for _, p in gke.fake.pools()) == ["system"] + [f"tpuctl-par-np-{i}" for i in range(3)]
    spans = _pool_ops(gke.fake)
    assert len(spans) == 3
    if gke.fake.one_op_per_cluster:   # GKE refused the others while one ran: tpuctl waited and retried
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))
        assert len([c for c in gke.fake.calls if c[0] == "create_pool"]) > 3
    else:   # all three were running at once: one pool's time, not three
        assert max(s for s, _ in spans) < min(e for _, e in spans)
    assert cli("down", "-c", "par", "--yes")[0] == 0
    assert gke.leaks() == []


def test_the_first_failure_in_order_is_raised_after_all_ended_and_nothing_is_left(gke, cli):
    """In an adopted cluster (each pool undone by itself): np-1 runs out of capacity, np-2 fails otherwise; every
    pool was asked for, np-1's error is the one said, and np-0 and the failed ones are gone."""
    _their_cluster(gke)
    gke.fake.delay = 0.3
    gke.fake.pool_faults["tpuctl-ad-np-1"] = _NO_ROOM
    gke.fake.pool_faults["tpuctl-ad-np-2"] = (13, "Internal error.")
    code, out, err = _up(cli, "ad", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team",
                         "--slices", "3")
    assert code == 4, err   # CAPACITY: np-1's, the first in order
    assert "out of capacity" in " ".join(err.split()) and "Traceback" not in err
    asked = {b["nodePool"]["name"] for a, _, b in gke.fake.calls if a == "create_pool"}
    assert asked == {f"tpuctl-ad-np-{i}" for i in range(3)}
    assert gke.leaks() == []
    assert [p["name"] for p in gke.fake.clusters[(PROJ, "us-east5", "team")]["nodePools"]] == ["default-pool"]


def test_a_cluster_busy_with_gkes_own_upgrade_is_waited_for(gke, cli):
    _their_cluster(gke)
    gke.fake.upgrade_before["create_pool"] = 0.5
    code, out, err = _up(cli, "up1", "--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team")
    assert code == 0, err
    assert "waiting for another operation on the cluster" in err
    assert gke.pool("tpuctl-up1-np-0")["status"] == "RUNNING"
    gke.fake.upgrade_before["delete_pool"] = 0.5   # and down waits as well
    code, out, err = cli("down", "-c", "up1", "--yes")
    assert code == 0, err
    assert "waiting for another operation on the cluster" in err
    assert gke.leaks() == []
