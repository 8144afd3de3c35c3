"""`up --provider gke --dry-run`: flags checked offline, the plan (node pools priced as the TPU type, the GKE
management fee named) for every family, TPU7x's workload policy; bad inputs exit 2 with one line and make nothing."""
from __future__ import annotations

import pytest

from tpuctl.core import state

PROJ = ("--project", "test-proj")


def _up(cli, *flags):
    return cli("up", "--provider", "gke", "-c", "g", "--dry-run", *PROJ, *flags)


@pytest.mark.parametrize("tpu_type, zone, pool_line", [
    ("v4-8", "us-central2-b", "ct4p-hightpu-4t x 1 (v4-8, 4 chips, topology 2x2x1)"),
    ("v5p-16", "us-east5-a", "ct5p-hightpu-4t x 2 (v5p-16, 8 chips, topology 2x2x2)"),
    ("v5litepod-16", "us-west4-a", "ct5lp-hightpu-4t x 4 (v5litepod-16, 16 chips, topology 4x4)"),
    ("v6e-16", "us-east5-b", "ct6e-standard-4t x 4 (v6e-16, 16 chips, topology 4x4)"),
    ("tpu7x-8", "us-central1-c", "tpu7x-standard-4t x 1 (tpu7x-8, 4 chips, topology 2x2x1)"),
])
def test_dry_run_plans_each_family(env, cli, tpu_type, zone, pool_line):
    code, out, err = _up(cli, "--type", tpu_type, "--zone", zone)
    assert code == 0, err
    assert f"pool   tpuctl-g-np-0  {pool_line} in {zone}" in err
    assert "$0.10/hour management fee" in err
    assert "workload policy" not in err   # single host, or not TPU7x
    assert "dry run: nothing was created" in err
    assert state.load("g") is None


def test_v6e_16_two_slices_priced_as_the_tpu_type_plus_the_fee(env, cli):
    code, out, err = _up(cli, "--type", "v6e-16", "--zone", "us-east5-b", "--slices", "2")
    assert code == 0, err
    assert "tpuctl-g-np-0" in err and "tpuctl-g-np-1" in err and "slice 1 of 2" in err
    # core/catalog.py: v6e $2.70/chip-hour x 16 chips = $43.20 a slice; + $0.10 fee + $0.134 e2-standard-4
    assert "$86.63/hour: 2 node pools at $43.20; with the GKE management fee ($0.10/hour)" in " ".join(err.split())
    assert "boot disks (GKE's default size and type) are billed as persistent disks, not counted" in \
        " ".join(err.split())


def test_tpu7x_multi_host_plans_a_workload_policy_and_names_the_version(env, cli):
    code, out, err = _up(cli, "--type", "tpu7x-16", "--zone", "us-central1-c")
    assert code == 0, err
    assert "policy tpuctl-g-wp  workload policy HIGH_THROUGHPUT, topology 2x2x2, in us-central1" in err
    assert "version >= 1.34.0-gke.2201000" in err
    assert "unknown: tpu7x-16 has no price in tpuctl's catalog" in " ".join(err.split())


def test_a_spot_price_the_catalog_lacks_is_said_unknown(env, cli):
    code, out, err = _up(cli, "--type", "v5p-16", "--zone", "us-east5-a", "--spot")
    assert code == 0, err
    assert "unknown: v5p-16 has no spot price in tpuctl's catalog" in " ".join(err.split())


def test_adopted_cluster_is_planned_as_kept_and_without_the_fee(env, cli):
    code, out, err = _up(cli, "--type", "v5litepod-16", "--zone", "us-west4-a", "--gke-cluster", "team-a", "--spot")
    assert code == 0, err
    assert "gke    team-a  existing cluster, adopted (down leaves it)" in err
    assert "management fee" not in err
    assert "spot" in err


@pytest.mark.parametrize("flags, says", [
    (("--type", "v3-8", "--zone", "us-central1-a"), "unknown TPU type 'v3-8' for GKE"),
    (("--type", "v6e-2", "--zone", "us-east5-b"), "v6e-2 is not a GKE TPU slice"),
    (("--zone", "us-east5-b"), "--type is required"),
    (("--type", "v6e-16", "--zone", "us-east5-b,us-east1-d"), "takes one --zone"),
    (("--type", "v6e-16", "--zone", "us-central2-b"), "v6e-16 is not offered in us-central2-b"),
    (("--type", "tpu7x-16", "--zone", "central"), "malformed zone"),
    (("--type", "v6e-4", "--zone", "us-east5-b", "--slices", "2"), "needs multi-host slices"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--slices", "0"), "--slices 0 is out of range"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--runtime", "tpu-vm-base"), "--runtime does not apply to"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--queued"), "--queued does not apply"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "Bad_Name"), "invalid --gke-cluster"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--image", "no spaces allowed"), "invalid --image"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--recover"), "--recover does not apply to --provider gke"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--autostop", "1h"), "not enforced on GKE"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--spot", "--reservation", "r1"), "exclude each other"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--reservation", "R_1"), "invalid --reservation"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--gke-cluster", "team", "--network", "v"), "has its own"),
    (("--type", "v6e-16", "--zone", "us-east5-b", "--network", "Bad_Net"), "invalid --network"),
    # issue 49 item 3: no TensorFlow on GKE, said before anything is made
    (("--type", "v6e-16", "--zone", "us-east5-b", "--framework", "tensorflow"), "TensorFlow does not run on GKE"),
])
def test_bad_inputs_exit_2_with_one_line(env, cli, flags, says):
    code, out, err = _up(cli, *flags)
    assert code == 2, err
    assert says in " ".join(err.split())
    assert "Traceback" not in err
    assert state.load("g") is None


def test_gke_flags_are_refused_by_the_gcp_provider(env, cli):
    code, out, err = cli("up", "--provider", "gcp", "-c", "g", "--dry-run", *PROJ, "--type", "v6e-4",
                         "--zone", "us-east5-b", "--gke-cluster", "team-a")
    assert code == 2
    assert "--gke-cluster applies to --provider gke only" in err


def test_kueues_queue_objects_validate_against_the_shipped_release():
    # the objects `up --kueue` applies, against the v1beta1 schemas of the Kueue release tpuctl ships
    import jsonschema
    from tpuctl.providers.gke import kueue_install, schema, tputypes
    crds = {o["spec"]["names"]["kind"]: o for o in kueue_install.release_objects()
            if o["kind"] == "CustomResourceDefinition"}
    for obj in kueue_install.queue_objects(tputypes.shape("v6e-16"), 2):
        if obj["kind"] == "PriorityClass":
            continue
        served = schema.version_schema(crds[obj["kind"]], "v1beta1")
        assert not schema.dropped(obj, served), obj["kind"]
        jsonschema.Draft7Validator(served).validate(obj)


def test_up_namespace_is_planned_checked_and_gke_only(env, cli):
    code, out, err = _up(cli, "--type", "v6e-16", "--zone", "us-east5-b", "--kueue", "--namespace", "team-a")
    assert code == 0, err
    said = " ".join(err.split())
    assert "namespace team-a the runs' Kubernetes namespace and the LocalQueue's, made if missing" in said, said
    code, out, err = _up(cli, "--type", "v6e-16", "--zone", "us-east5-b", "--namespace", "Team_A")
    assert code == 2 and "invalid --namespace 'Team_A'" in err
    code, out, err = cli("up", "--provider", "gcp", "-c", "g", "--dry-run", *PROJ, "--type", "v6e-4",
                         "--zone", "us-east5-b", "--namespace", "team-a")
    assert code == 2 and "--namespace applies to --provider gke only" in err
    code, out, err = cli("up", "--provider", "local", "-c", "l", "--dry-run", "--namespace", "team-a")
    assert code == 2 and "--namespace" in err
