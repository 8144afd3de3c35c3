"""Issue 49 item 5: a maintenance exclusion (scope NO_MINOR_OR_NODE_UPGRADES) on a cluster tpuctl made while its
runs are active, through the real google-cloud-container client against the GKE fake's setMaintenancePolicy
(resourceVersion checked; a stale one answered either way the fake knows); never on an adopted cluster; lifted
with the last run (test_gke_up_submit's end-to-end run checks that part)."""
from __future__ import annotations

import datetime as dt

import pytest

from test_gke_flow import PROJ, _gke_servers  # noqa: F401  (the GKE fakes' session fixture)
from tpuctl.providers.gke import maintenance

_NOW = dt.datetime(2026, 11, 28, 17, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(params=["409-aborted", "400-failed-precondition"])
def fake(request, env, _gke_servers, monkeypatch):
    g, _, (gurl, _) = _gke_servers
    g.reset()
    if request.param.startswith("400"):
        g.stale_answer = (400, ("FAILED_PRECONDITION", "Resource version mismatch."))
    monkeypatch.setenv("CONTAINER_EMULATOR_HOST", gurl)
    g.do_create_cluster({"cluster": {"name": "tpuctl-m", "nodePools": [{"name": "system"}],
                                     "maintenancePolicy": {"window": {"maintenanceExclusions": {"owners-freeze": {
                                         "startTime": "2026-12-20T00:00:00Z", "endTime": "2026-12-27T00:00:00Z"}}}}}},
                        PROJ, "us-east5-b")
    return g


def _rec(adopted=False):
    return {"project": PROJ, "location": "us-east5-b", "cluster": "tpuctl-m", "adopted": adopted}


def test_a_run_holds_node_upgrades_off_and_the_last_run_lifts_it(fake):
    fake.policy_edits_before_set = 1   # someone else sets the policy between tpuctl's read and its set
    assert maintenance.hold(_rec(), _NOW) is True
    ex = fake.exclusions(PROJ, "us-east5-b", "tpuctl-m")
    assert set(ex) == {"owners-freeze", "tpuctl-runs"}   # the owner's kept: the whole policy is sent back
    mine = ex["tpuctl-runs"]
    assert mine["maintenanceExclusionOptions"]["scope"] in ("NO_MINOR_OR_NODE_UPGRADES", 2)
    assert mine["startTime"].startswith("2026-11-28T17:00:00") and mine["endTime"].startswith("2026-12-28T17:00:00")
    sets = [c for c in fake.calls if c[0] == "set_maintenance"]
    assert len(sets) == 2   # the stale one refused, then again with the version read anew
    assert maintenance.hold(_rec(), _NOW + dt.timedelta(minutes=5)) is False   # a second run: already held
    assert maintenance.release(_rec()) is True
    assert set(fake.exclusions(PROJ, "us-east5-b", "tpuctl-m")) == {"owners-freeze"}
    assert maintenance.release(_rec()) is False


def test_an_adopted_cluster_is_never_touched(fake):
    assert maintenance.hold(_rec(adopted=True), _NOW) is False
    assert maintenance.release(_rec(adopted=True)) is False
    assert [c for c in fake.calls if c[0] == "set_maintenance"] == []


def test_the_hold_is_bounded_by_the_knob_and_a_refusal_is_one_clear_error(fake, monkeypatch):
    monkeypatch.setenv("TPUCTL_GKE_HOLD_DAYS", "2")
    assert maintenance.hold(_rec(), _NOW) is True
    assert fake.exclusions(PROJ, "us-east5-b", "tpuctl-m")["tpuctl-runs"]["endTime"].startswith("2026-11-30T17")
    fake.faults["set_maintenance"].append((403, "PERMISSION_DENIED", "Required 'container.clusters.update'."))
    from tpuctl.core.errors import TpuctlError
    with pytest.raises(TpuctlError) as e:
        maintenance.release(_rec())
    assert "maintenance policy" in e.value.message
