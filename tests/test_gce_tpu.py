"""TPUs through Compute Engine (`up --api compute`, and always TPU7x): the real CLI and google-cloud-compute against
the Compute fake (tests/fakes/compute_tpu.py), with simulated hosts booting from the VMs' start-up scripts."""
import json

import pytest
from conftest import PROJECT, until

from fakes import compute_tpu
from jobs import make_job
from test_watch import fast  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("no_leak")   # every test ends with nothing of tpuctl left

ZONE = "us-central1-c"
BUCKET = f"{PROJECT}-tpuctl-ir"


@pytest.fixture(params=[False, True], ids=["op-error-only", "op-error-with-http-fields"])
def both_error_shapes(request, cloud):
    """A failed operation with and without httpErrorStatusCode/httpErrorMessage (GCE_TPU_FACTS §9)."""
    cloud.compute.http_error_fields = request.param
    return request.param


def _hosts(cloud, monkeypatch):
    cloud.hosts.enabled = True
    cloud.hosts.env.update(TPUCTL_BOOT_RETRY_SECONDS="90", TPUCTL_LOG_POLL_MAX="0.2")
    monkeypatch.setenv("TPUCTL_LOG_POLL_MAX", "0.2")
    return cloud.hosts


def _wait_agents(hosts, n, timeout=180):
    def found():
        return [h for hs in hosts.hosts.values() for h in hs]

    def said():
        return "\n".join(f"--- {h.name}\n{h.boot_log()}\n{(h.root / 'startup.out').read_text()}\n{h.agent_out()}"
                         for h in found())

    def running():
        return len(found()) == n and all("agent running" in h.boot_log() for h in found())
    until(lambda: running() or any("FAILED" in h.boot_log() for h in found()), timeout, said, every=0.2)
    assert running(), said()
    return found()


def test_tpu7x_single_host_is_one_vm_and_down_leaves_nothing(cloud, cli):
    code, out, err = cli("up", "--type", "tpu7x-8", "--zone", ZONE, "-c", "ir", "--dry-run")
    assert code == 0, err
    assert "through Compute Engine" in err and "tpu7x-standard-4t" in err and "tpu7x-8 has no price in" in err
    assert "boot disk 100 GB hyperdisk-balanced" in " ".join(err.split()), err
    code, out, err = cli("up", "--type", "tpu7x-8", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    vm = cloud.compute.instances[(PROJECT, ZONE, "tpuctl-ir")]
    assert vm["machineType"] == f"zones/{ZONE}/machineTypes/tpu7x-standard-4t"
    assert vm["scheduling"] == {"onHostMaintenance": "TERMINATE"}
    assert vm["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert vm["disks"][0]["initializeParams"]["sourceImage"] == \
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"
    assert vm["disks"][0]["initializeParams"]["diskType"] == \
        f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/diskTypes/hyperdisk-balanced"
    assert vm["networkInterfaces"][0]["nicType"] == "GVNIC" and vm["networkInterfaces"][0]["accessConfigs"]
    assert vm["labels"]["tpuctl-cluster"] == "ir" and "advancedMachineFeatures" not in vm
    script = next(i["value"] for i in vm["metadata"]["items"] if i["key"] == "startup-script")
    assert 'ROLE="tpu-vm"' in script and 'ACCELERATOR="tpu7x-8"' in script
    assert not cloud.tpu.nodes[2] and not cloud.compute.migs   # nothing through the TPU API, no MIG for one host
    info = json.loads(cli("status", "-c", "ir", "--json")[1])
    assert info["resources"]["tpu"]["state"] == "READY" and info["framework"] == "jax"
    code, out, err = cli("down", "-c", "ir", "--yes")
    assert code == 0, err
    assert cloud.leaks() == []


@pytest.mark.parametrize("flags, want", [
    (["--type", "v5litepod-8", "--api", "compute"], "Compute Engine does not serve v5litepod"),
    (["--type", "tpu7x-8", "--api", "tpu"], "the Cloud TPU API does not serve tpu7x"),
    (["--type", "tpu7x-8", "--framework", "tensorflow"], "no TensorFlow for tpu7x"),
    (["--type", "tpu7x-8", "--queued"], "--queued and --valid-until ask the Cloud TPU API"),
    (["--type", "v6e-4", "--flex-start", "--zone", "us-east5-a"], "--flex-start needs --api compute"),
    (["--type", "tpu7x-8", "--flex-start", "--spot"], "two provisioning models"),
    (["--type", "tpu7x-8", "--flex-start"], "--flex-start needs --max-duration"),
    (["--type", "tpu7x-8", "--flex-start", "--max-duration", "8d"], "at most 7 days"),
])
def test_refused_in_one_line_before_anything_is_made(cloud, cli, flags, want):
    code, out, err = cli("up", *flags, *([] if "--zone" in flags else ["--zone", ZONE]), "-c", "ir", "--yes")
    assert code != 0 and want in err and "Traceback" not in err, err
    assert cloud.mutating_calls() == []


def test_v6e_8_single_host_sets_threads_per_core_and_spot_stops(cloud, cli):
    code, out, err = cli("up", "--type", "v6e-8", "--api", "compute", "--spot", "--zone", "us-east5-a", "-c", "ir",
                         "--yes")
    assert code == 0, err
    vm = cloud.compute.instances[(PROJECT, "us-east5-a", "tpuctl-ir")]
    assert vm["machineType"].endswith("/ct6e-standard-8t")
    assert vm["advancedMachineFeatures"] == {"threadsPerCore": 1}
    assert vm["scheduling"] == {"onHostMaintenance": "TERMINATE", "provisioningModel": "SPOT",
                                "instanceTerminationAction": "STOP", "automaticRestart": False}


def test_multi_host_is_a_mig_with_a_workload_policy(cloud, cli):
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    [(key, policy)] = cloud.compute.policies.items()
    assert key == (PROJECT, "us-central1", "tpuctl-ir-wp")
    assert policy["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    tpl = cloud.compute.templates[(PROJECT, "tpuctl-ir-template")]
    assert tpl["properties"]["machineType"] == "tpu7x-standard-4t"
    m = cloud.compute.migs[(PROJECT, ZONE, "tpuctl-ir")]["mig"]
    assert m["targetSize"] == 2 and "targetSizePolicy" not in m   # bulk only with flex-start or a reservation
    assert m["resourcePolicies"]["workloadPolicy"] == f"projects/{PROJECT}/regions/us-central1/resourcePolicies/" \
                                                      "tpuctl-ir-wp"
    assert len([k for k in cloud.compute.instances if k[2].startswith("tpuctl-ir-")]) == 2
    info = json.loads(cli("status", "-c", "ir", "--json")[1])
    assert info["resources"]["tpu"]["state"] == "READY" and info["resources"]["tpu"]["hosts"] == 2
    code, out, err = cli("down", "-c", "ir", "--yes")
    assert code == 0, err


def test_a_stockout_fails_over_to_the_next_zone(cloud, cli, both_error_shapes):
    cloud.compute.stockout_zones = {"us-central1-c"}
    code, out, err = cli("up", "--type", "tpu7x-8", "--zone", "us-central1-c,us-central1-ai1a", "-c", "ir",
                         "--yes")
    assert code == 0, err
    assert (PROJECT, "us-central1-ai1a", "tpuctl-ir") in cloud.compute.instances
    assert not any(k[1] == "us-central1-c" for k in cloud.compute.instances)


def test_a_mig_stockout_fails_over_and_removes_what_it_made(cloud, cli):
    cloud.compute.stockout_zones = {"us-central1-c"}
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", "us-central1-c,us-central1-ai1a", "-c", "ir",
                         "--yes")
    assert code == 0, err
    assert set(cloud.compute.migs) == {(PROJECT, "us-central1-ai1a", "tpuctl-ir")}


def test_a_stockout_in_every_zone_is_one_line_and_leaves_nothing(cloud, cli, both_error_shapes):
    cloud.compute.stockout_zones = {"us-central1-c"}
    code, out, err = cli("up", "--type", "tpu7x-8", "--zone", "us-central1-c", "-c", "ir", "--yes")
    assert code != 0 and "does not have enough resources" in err and "Traceback" not in err, err
    assert not cloud.compute.instances


@pytest.mark.slow(25)
def test_flex_start_mig_is_bulk_with_repairs_off_and_a_run_duration(cloud, cli, monkeypatch):
    """Also the flex-start MIG's request bodies against compute_v1 (_check_bodies, as every other body in
    test_every_request_body_has_only_fields_the_compute_api_has)."""
    # --max-duration: up waits for the host's word that it can end the compute, which worker 0 alone gives
    # (host/autostop.py): the other three VMs' guests need not boot
    _hosts(cloud, monkeypatch).only = lambda resource, kind, worker: worker == 0
    code, out, err = cli("up", "--type", "v6e-16", "--api", "compute", "--flex-start", "--max-duration", "2h",
                         "--zone", "us-east5-a", "-c", "ir", "--yes")
    assert code == 0, err
    tpl = cloud.compute.templates[(PROJECT, "tpuctl-ir-template")]["properties"]
    assert tpl["machineType"] == "ct6e-standard-4t"
    assert tpl["scheduling"] == {"onHostMaintenance": "TERMINATE", "provisioningModel": "FLEX_START",
                                 "instanceTerminationAction": "DELETE", "maxRunDuration": {"seconds": "8100"}}
    # Google's run duration 15 min after the host's own deadline: the host deletes the MIG first, which would
    # otherwise make its VMs again after Google deleted them at the end of their run (issue 59)
    assert tpl["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}   # Google's flex-start example
    assert tpl["disks"][0]["initializeParams"]["diskType"] == "hyperdisk-balanced"   # a template: the bare name
    m = cloud.compute.migs[(PROJECT, "us-east5-a", "tpuctl-ir")]["mig"]
    assert m["targetSize"] == 4 and m["targetSizePolicy"] == {"mode": "BULK"}
    assert m["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}
    assert cloud.compute.policies[(PROJECT, "us-east5", "tpuctl-ir-wp")]["workloadPolicy"]["acceleratorTopology"] \
        == "4x4"
    assert {a for a, _ in cloud.compute.bodies} >= {"tpl_insert", "rp_insert", "mig_insert"}
    _check_bodies(cloud)


@pytest.mark.parametrize("kind, reservation, model", [
    ("calendar", "cal-1", "RESERVATION_BOUND"), ("dense", "d-1", "RESERVATION_BOUND"),
    ("default", "r-1", None), ("default", "projects/shared-p/reservations/r-2", None)])
def test_reservation_is_bound_only_when_calendar_or_dense_and_always_specific(cloud, cli, kind, reservation, model):
    """RESERVATION_BOUND "only for a specific reservation with either a calendar reservation mode or a dense
    deployment type" (gcloud instances/flags.py): tpuctl reads the reservation to know (FutureReservation.
    reservationMode, Reservation.deploymentType); any other is consumed by a STANDARD VM with a SPECIFIC affinity. A
    reservation shared from another project is named projects/P/reservations/R."""
    project, name = (reservation.split("/")[1], reservation.split("/")[3]) if "/" in reservation else (PROJECT,
                                                                                                       reservation)
    cloud.compute.add_reservation(project, ZONE, name, kind)
    code, out, err = cli("up", "--type", "tpu7x-8", "--reservation", reservation, "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    vm = cloud.compute.instances[(PROJECT, ZONE, "tpuctl-ir")]
    assert vm["scheduling"].get("provisioningModel") == model, vm["scheduling"]
    assert vm["reservationAffinity"] == {"consumeReservationType": "SPECIFIC_RESERVATION",
                                         "key": "compute.googleapis.com/reservation-name", "values": [reservation]}


def test_a_reservation_elsewhere_moves_on_and_a_multi_host_one_is_bulk_only_when_bound(cloud, cli):
    cloud.compute.add_reservation(PROJECT, "us-central1-ai1a", "r-1", "default")
    code, out, err = cli("up", "--type", "tpu7x-16", "--reservation", "r-1", "--zone", f"{ZONE},us-central1-ai1a",
                         "-c", "ir", "--dry-run")
    assert code == 0 and "a calendar-mode or dense one is RESERVATION_BOUND" in err, err
    code, out, err = cli("up", "--type", "tpu7x-16", "--reservation", "r-1", "--zone", f"{ZONE},us-central1-ai1a",
                         "-c", "ir", "--yes")
    assert code == 0, err
    assert f"reservation r-1 is not in {ZONE}" in err and "trying us-central1-ai1a" in err, err
    m = cloud.compute.migs[(PROJECT, "us-central1-ai1a", "tpuctl-ir")]["mig"]
    assert "targetSizePolicy" not in m   # bulk mode takes reservation-bound (and flex-start) only
    tpl = cloud.compute.templates[(PROJECT, "tpuctl-ir-template")]["properties"]
    assert "provisioningModel" not in tpl["scheduling"] and tpl["reservationAffinity"]["values"] == ["r-1"]


def test_single_host_runs_a_jax_job_end_to_end(cloud, cli, tmp_path, monkeypatch):
    hosts = _hosts(cloud, monkeypatch)
    code, out, err = cli("up", "--type", "tpu7x-8", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    [host] = _wait_agents(hosts, 1)
    assert "installed python3-venv" in host.boot_log()   # the accelerator image has no pip (GCE_TPU_FACTS §5)
    job = make_job(tmp_path, "import os\nprint('on', os.environ['TPUCTL_ACCELERATOR'], os.environ['TPUCTL_WORKER'],"
                             " os.environ['TPUCTL_NUM_WORKERS'])\n", 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "ir")
    assert code == 0, err + host.agent_out()
    assert out.split() == ["on", "tpu7x-8", "0", "1"]
    assert cli("down", "-c", "ir", "--yes")[0] == 0


def test_multi_host_workers_learn_their_ids_from_metadata(cloud, cli, tmp_path, monkeypatch):
    """Whether a Compute Engine TPU VM's metadata has agent-worker-number is not known (§5): worker 0's has it here,
    worker 1's has tpu-env's TPU_WORKER_ID alone (were that not read, worker 1 would take itself for worker 0)."""
    hosts = _hosts(cloud, monkeypatch)
    cloud.compute.agent_worker_number = {0}
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    found = _wait_agents(hosts, 2)
    assert sorted(h.worker for h in found) == [0, 1]
    job = make_job(tmp_path, "import os\nprint('w', os.environ['TPUCTL_WORKER'], os.environ['TPUCTL_NUM_WORKERS'],"
                             " os.environ.get('TPUCTL_JAX_COORDINATOR', '-'), os.environ.get('TPUCTL_JAX_PROCESS_ID',"
                             " '-'))\n", 'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "ir")
    assert code == 0, err + "".join(h.agent_out() for h in found)
    first = next(h.name for h in found if h.worker == 0)   # worker-network-endpoints' first: worker 0 (§5)
    assert out.split() == ["w", "0", "2", f"{first}:8482", "0"], out
    code, out1, err = cli("logs", "-c", "ir", "--worker", "1")
    assert out1.split() == ["w", "1", "2", f"{first}:8482", "1"], out1 + err
    assert cli("down", "-c", "ir", "--yes")[0] == 0


@pytest.mark.parametrize("missing, role", [
    ("compute.instanceGroupManagers.create", "roles/compute.instanceAdmin.v1"),
    ("compute.instanceTemplates.useReadOnly", "roles/compute.instanceAdmin.v1")])   # a MIG reads its template
def test_a_missing_compute_permission_stops_up_before_anything_is_made(cloud, cli, missing, role):
    from fakes.resource_manager import OTHER_PERMISSIONS, TPU_PERMISSIONS
    cloud.iam.held = set(TPU_PERMISSIONS + OTHER_PERMISSIONS) - {missing}
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "ir", "--yes")
    assert code != 0 and missing in err and role in err, err
    assert cloud.mutating_calls() == []


def test_acting_as_the_vms_service_account_is_named_before_anything_is_made(cloud, cli):
    """The VMs run as a service account: the caller needs iam.serviceAccounts.actAs, which a grant on that account
    alone may give, so a project that lacks it is a warning (permissions.py), said before anything is made."""
    from fakes.resource_manager import OTHER_PERMISSIONS, TPU_PERMISSIONS
    cloud.iam.held = set(TPU_PERMISSIONS + OTHER_PERMISSIONS) - {"iam.serviceAccounts.actAs"}
    code, out, err = cli("up", "--type", "tpu7x-8", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0 and "iam.serviceAccounts.actAs" in err and "roles/iam.serviceAccountUser" in err, err
    assert err.index("iam.serviceAccounts.actAs") < err.index("creating VM"), err


@pytest.mark.parametrize("tpu, gone", [("tpu7x-8", "instance"), ("tpu7x-16", "mig")])
def test_autostop_the_host_deletes_its_vm_or_mig_then_down_removes_the_rest(live_hosts, cloud, cli, tpu, gone):
    # worker 0 alone reports, keeps the clock and deletes (host/autostop.py): the MIG's other VM need not boot
    live_hosts.only = lambda resource, kind, worker: worker == 0
    code, out, err = cli("up", "--type", tpu, "--zone", ZONE, "-c", "ir", "--autostop", "3s", "--yes")
    assert code == 0, err
    assert "armed: enforced by the host" in err, err
    key = (PROJECT, ZONE, "tpuctl-ir")
    until(lambda: key not in (cloud.compute.instances if gone == "instance" else cloud.compute.migs), 120,
          lambda: "".join(h.agent_out() for hs in live_hosts.hosts.values() for h in hs))
    asked = [p for a, p in cloud.compute.calls if a in ("delete", "mig_delete")]
    assert asked == [f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/" +
                     ("instances/tpuctl-ir" if gone == "instance" else "instanceGroupManagers/tpuctl-ir")]
    assert not [k for k in cloud.compute.instances if k[2].startswith("tpuctl-ir")]
    assert cli("down", "-c", "ir", "--yes")[0] == 0   # a MIG's template and workload policy: `down`'s
    assert cloud.leaks() == []


def test_ls_lists_a_clusters_parts_once_and_down_from_labels_removes_them(cloud, cli, env):
    assert cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "ir", "--yes")[0] == 0
    rows = json.loads(cli("ls", "--json")[1])
    assert [r for r in rows if r["orphan"] and r["kind"] != "bucket"] == [], rows   # its MIG, template, policy
    (env / "home" / "clusters" / "ir.json").unlink()   # another machine: no local state
    rows = [r for r in json.loads(cli("ls", "--json", "--project", PROJECT)[1]) if r["kind"] != "bucket"]
    assert sorted(r["kind"] for r in rows) == ["mig", "template", "workload policy"], rows
    assert all(r["orphan"] and r["remove"] == f"tpuctl down -c ir --project {PROJECT}" for r in rows)
    code, out, err = cli("down", "-c", "ir", "--project", PROJECT, "--yes")
    assert code == 0, err
    assert not cloud.compute.migs and not cloud.compute.templates and not cloud.compute.policies


def _recoveries(bucket):
    from google.cloud import storage

    from tpuctl.core import layout
    b = storage.Client(project=PROJECT).bucket(bucket)
    return [json.loads(x.download_as_bytes()) for x in b.list_blobs(prefix=layout.RECOVERIES_PREFIX)]


@pytest.mark.parametrize("tpu, on_preempt, recreated", [
    ("tpu7x-8", "repair", True),        # a bare Spot VM: TERMINATED, deleted and made again by the watcher
    ("tpu7x-16", "repair", False),      # the MIG repairs its VM itself: Google's doing, no attempt spent
    ("tpu7x-16", "nothing", True)])     # the MIG leaves it TERMINATED: the watcher makes the slice again
def test_a_preempted_spot_vm_is_brought_back(cloud, cli, fast, tpu, on_preempt, recreated):
    from test_watch import Running
    cloud.compute.on_preempt = on_preempt
    code, out, err = cli("up", "--type", tpu, "--zone", ZONE, "-c", "w", "--spot", "--recover", "--yes")
    assert code == 0, err
    w = Running()
    until(lambda: any("holding its lease" in m for m in w.said.lines), what="the lease")
    vms = sorted(k[2] for k in cloud.compute.instances if k[2].startswith("tpuctl-w"))
    cloud.compute.preempt(PROJECT, ZONE, vms[-1])
    if recreated:
        until(lambda: _recoveries(f"{PROJECT}-tpuctl-w"), what="a recovery")
        [rec] = _recoveries(f"{PROJECT}-tpuctl-w")
        assert "PREEMPTED" in rec["lost"] or "MISSING" in rec["lost"], rec
    until(lambda: len([k for k, v in cloud.compute.instances.items() if k[2].startswith("tpuctl-w")
                       and v["status"] == "RUNNING"]) == len(vms), what="the slice back")
    if not recreated:
        assert json.loads(cli("status", "-c", "w", "--json")[1])["resources"]["tpu"]["state"] == "READY"
        assert _recoveries(f"{PROJECT}-tpuctl-w") == []
    assert cli("down", "-c", "w", "--yes")[0] == 0
    assert w.wait() == "`tpuctl down`"


BODY_TYPES = {"insert": "Instance", "tpl_insert": "InstanceTemplate", "rp_insert": "ResourcePolicy",
              "mig_insert": "InstanceGroupManager", "fw_insert": "Firewall"}


def _unknown_fields(doc, descriptor, where=""):
    """Every key of `doc` that is not a field (by its JSON name) of the proto message `descriptor`, recursively."""
    fields = {f.json_name: f for f in descriptor.fields}
    bad = []
    for key, value in doc.items():
        f = fields.get(key)
        if f is None:
            bad.append(f"{where}{key}")
            continue
        if f.message_type is None or f.message_type.GetOptions().map_entry:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                bad += _unknown_fields(item, f.message_type, f"{where}{key}.")
    return bad


def test_disk_size_and_type_and_internal_ips_reach_the_vm(cloud, cli):
    code, out, err = cli("up", "--type", "v5p-8", "--api", "compute", "--zone", "us-east5-a", "-c", "ir",
                         "--disk-size", "500", "--disk-type", "hyperdisk-ml", "--internal-ips", "--yes")
    assert code == 0, err
    vm = cloud.compute.instances[(PROJECT, "us-east5-a", "tpuctl-ir")]
    assert vm["disks"][0]["initializeParams"]["diskSizeGb"] == "500"
    assert vm["disks"][0]["initializeParams"]["diskType"].endswith("/zones/us-east5-a/diskTypes/hyperdisk-ml")
    assert "accessConfigs" not in vm["networkInterfaces"][0] and "nicType" not in vm["networkInterfaces"][0]


@pytest.mark.parametrize("flags, want", [
    (["--type", "tpu7x-8", "--disk-type", "pd-balanced"], "one of hyperdisk-balanced, hyperdisk-ml"),
    (["--type", "tpu7x-8", "--disk-size", "5"], "a boot disk is 10 to 65536 GB"),
    (["--type", "v5litepod-8", "--disk-size", "200"], "--disk-size applies to --api compute only"),
    (["--type", "tpu7x-8", "--flex-wait", "1h"], "add --flex-start"),
])
def test_disk_and_network_flags_refused_before_anything_is_made(cloud, cli, flags, want):
    code, out, err = cli("up", *flags, "--zone", ZONE if "tpu7x" in flags[1] else "us-west4-a", "-c", "ir", "--yes")
    assert code != 0 and want in err and "Traceback" not in err, err
    assert cloud.mutating_calls() == []


@pytest.mark.parametrize("machine, disk, refused", [
    ("tpu7x-standard-4t", None, True), ("tpu7x-standard-4t", "pd-balanced", True),
    ("tpu7x-standard-4t", "hyperdisk-balanced", False), ("ct5p-hightpu-4t", "pd-balanced", False),
    ("ct6e-standard-4t", "hyperdisk-ml", False), ("ct5p-hightpu-4t", "hyperdisk-balanced", True)])
def test_the_fake_refuses_a_tpu_boot_disk_without_a_listed_type(cloud, machine, disk, refused):
    """tpu/docs/storage-options-compute's table, as the fake answers it; an instance names the type by URL, a template
    by its bare name."""
    params = {"sourceImage": "projects/ubuntu-os-accelerator-images/global/images/family/x"}
    vm = {"name": "d", "machineType": f"zones/{ZONE}/machineTypes/{machine}", "scheduling": {
        "onHostMaintenance": "TERMINATE"}, "disks": [{"boot": True, "initializeParams": dict(params, **(
            {"diskType": f"zones/{ZONE}/diskTypes/{disk}"} if disk else {}))}]}
    code, _ = cloud.compute.handle("POST", f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances", vm)
    assert (code == 400) is refused
    tpl = {"name": "t", "properties": {"machineType": machine, "disks": [{"boot": True, "initializeParams": dict(
        params, **({"diskType": disk} if disk else {}))}]}}
    code, _ = cloud.compute.handle("POST", f"/compute/v1/projects/{PROJECT}/global/instanceTemplates", tpl)
    assert (code == 400) is refused
    cloud.compute.instances.clear()
    cloud.compute.templates.clear()


def _check_bodies(cloud):
    """Each body tpuctl sent, read from the fake, against google-cloud-compute's compute_v1 messages (their JSON
    names are the wire's: the discovery document's camelCase); per family, the boot disk type (a URL on an instance,
    the bare name in a template), reservation affinity and NIC type (issue 59: tpu/docs/storage-options-compute;
    Google's flex-start example; gVNIC on TPU7x). Returns the actions seen."""
    from google.cloud import compute_v1
    seen = set()
    for action, body in cloud.compute.bodies:
        if action not in BODY_TYPES:
            continue
        seen.add(action)
        message = getattr(compute_v1, BODY_TYPES[action]).pb().DESCRIPTOR
        assert _unknown_fields(body, message) == [], (action, body)
    want_disk = {"tpu7x": "hyperdisk-balanced", "ct6e": "hyperdisk-balanced", "ct5p": "pd-balanced"}
    for action, body in cloud.compute.bodies:
        props = body.get("properties", body) if action in ("insert", "tpl_insert") else None
        if props is None or props["machineType"].rsplit("/", 1)[-1] not in compute_tpu.TPU_MACHINES:
            continue
        series = props["machineType"].rsplit("/", 1)[-1].split("-")[0]
        disk = props["disks"][0]["initializeParams"]["diskType"]
        assert disk == want_disk[series] if action == "tpl_insert" else disk.endswith(f"/diskTypes/{want_disk[series]}")
        model = props["scheduling"].get("provisioningModel")
        affinity = props.get("reservationAffinity", {}).get("consumeReservationType")
        assert affinity == {"FLEX_START": "NO_RESERVATION", "RESERVATION_BOUND": "SPECIFIC_RESERVATION"}.get(model), \
            (model, affinity)
        assert (props["networkInterfaces"][0].get("nicType") == "GVNIC") is (series == "tpu7x")
    return seen


def test_every_request_body_has_only_fields_the_compute_api_has(cloud, cli):
    """_check_bodies on a spot VM, a reservation-bound MIG and a Multislice of MIGs; the flex-start MIG's bodies are
    checked so in test_flex_start_mig_is_bulk_with_repairs_off_and_a_run_duration, whose `up` (--max-duration)
    needs a host's word and so a booted guest, which none of these does."""
    from google.cloud import compute_v1
    cloud.compute.add_reservation(PROJECT, ZONE, "r1", "dense")
    for k, flags in enumerate([["--type", "tpu7x-8", "--spot"], ["--type", "tpu7x-16", "--reservation", "r1"],
                               ["--type", "v6e-8", "--api", "compute", "--slices", "2"]]):
        zone = ZONE if "tpu7x" in flags[1] else "us-east5-a"
        code, out, err = cli("up", *flags, "--zone", zone, "-c", f"f{k}", "--yes")
        assert code == 0, err
    assert _check_bodies(cloud) >= {"insert", "tpl_insert", "rp_insert", "mig_insert"}
    assert _unknown_fields({"machineType": "x", "acceleratorType": "y"}, compute_v1.Instance.pb().DESCRIPTOR) \
        == ["acceleratorType"]   # the check itself finds a field the API does not have


@pytest.mark.slow(40)
def test_two_slices_of_migs_run_one_jax_job_with_megascale_and_the_agents_cluster(cloud, cli, tmp_path, monkeypatch):
    """`--slices 2` through Compute Engine: a MIG per slice, one run on both slices' hosts, each with MEGASCALE_* on
    slice 0's worker 0 and the agent's JAX cluster (coordinator on the same host, process id slice x hosts +
    worker), as jax.distributed.initialize() needs where its own detection finds no cluster (host/jaxcluster.py)."""
    hosts = _hosts(cloud, monkeypatch)
    code, out, err = cli("up", "--type", "tpu7x-8", "--slices", "2", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    assert sorted(k[2] for k in cloud.compute.migs) == ["tpuctl-ir-0", "tpuctl-ir-1"]
    _wait_agents(hosts, 2)
    keys = ["TPUCTL_WORKER", "TPUCTL_NUM_WORKERS", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
            "MEGASCALE_COORDINATOR_ADDRESS", "TPUCTL_JAX_COORDINATOR", "TPUCTL_JAX_NUM_PROCESSES",
            "TPUCTL_JAX_PROCESS_ID"]
    job = make_job(tmp_path, f"import os\nprint(' '.join(f'{{k}}={{os.environ.get(k, \"-\")}}' for k in {keys!r}))\n",
                   'framework = "jax"\n')
    code, out, err = cli("submit", str(job), "-c", "ir")
    assert code == 0, err + "".join(h.agent_out() for hs in hosts.hosts.values() for h in hs)
    seen = []
    for k in (0, 1):
        code, out, err = cli("logs", "-c", "ir", "--slice", str(k), "--worker", "0")
        assert code == 0, err
        seen.append(dict(kv.split("=", 1) for kv in out.split()))
    coordinator = seen[0]["MEGASCALE_COORDINATOR_ADDRESS"].split(":")[0]
    assert coordinator not in ("", "-")
    for k, env in enumerate(seen):
        assert env["MEGASCALE_NUM_SLICES"] == "2" and env["MEGASCALE_SLICE_ID"] == str(k), env
        assert env["TPUCTL_WORKER"] == str(k) and env["TPUCTL_NUM_WORKERS"] == "2", env
        assert env["MEGASCALE_COORDINATOR_ADDRESS"].split(":")[0] == coordinator, env
        assert env["TPUCTL_JAX_COORDINATOR"] == f"{coordinator}:8482" and env["TPUCTL_JAX_NUM_PROCESSES"] == "2", env
        assert env["TPUCTL_JAX_PROCESS_ID"] == str(k), env
    assert [r["state"] for r in json.loads(cli("jobs", "-c", "ir", "--json")[1])] == ["succeeded"]
    assert cli("down", "-c", "ir", "--yes")[0] == 0


@pytest.mark.slow(30)
@pytest.mark.parametrize("op_waits", [False, True], ids=["insert-done-vm-pending", "insert-running-while-pending"])
def test_a_flex_start_vm_waits_for_capacity_and_moves_on_when_google_deletes_it(cloud, cli, monkeypatch, op_waits):
    """A single flex-start VM asks to wait (params.requestValidForDuration, --flex-wait) and is PENDING meanwhile;
    where its wait ends without capacity Compute Engine deletes it (instance-lifecycle), which is that zone's answer:
    `up` tries the next zone, where the VM waits 3 polls and runs. Whether the insert stays RUNNING meanwhile is
    not documented: both ways."""
    _hosts(cloud, monkeypatch)   # --max-duration: up waits for the host's word that it can end the compute
    cloud.compute.flex_op_waits, cloud.compute.flex_polls = op_waits, 3
    cloud.compute.flex_no_capacity = {ZONE}
    code, out, err = cli("up", "--type", "tpu7x-8", "--flex-start", "--max-duration", "2h", "--flex-wait", "30m",
                         "--zone", f"{ZONE},us-central1-ai1a", "-c", "ir", "--yes")
    assert code == 0, err
    assert f"no flex-start capacity for tpu7x-8 in {ZONE} within 30 min" in err and "trying us-central1-ai1a" in err
    assert "waiting for flex-start capacity" in err, err
    [(action, first), (_, second)] = [(a, b) for a, b in cloud.compute.bodies if a == "insert"]
    assert first["params"] == {"requestValidForDuration": {"seconds": "1800"}}
    assert first["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert cloud.compute.instances[(PROJECT, "us-central1-ai1a", "tpuctl-ir")]["status"] == "RUNNING"
    assert not any(k[1] == ZONE for k in cloud.compute.instances)
    assert cli("down", "-c", "ir", "--yes")[0] == 0


@pytest.mark.parametrize("wait, want", [("60s", "--flex-wait is from 90s"), ("3h", "to 2h")])
def test_flex_wait_out_of_range_is_refused(cloud, cli, wait, want):
    code, out, err = cli("up", "--type", "tpu7x-8", "--flex-start", "--max-duration", "2h", "--flex-wait", wait,
                         "--zone", ZONE, "-c", "ir", "--yes")
    assert code != 0 and want in err and "Traceback" not in err, err
    assert cloud.mutating_calls() == []


def test_the_multislice_coordinator_is_worker_0_of_slice_0_whatever_the_names(cloud, cli):
    """A MIG's VMs are named with a random suffix and numbered by Google (tpu-env TPU_WORKER_ID, §5): the record's
    coordinator (MEGASCALE_COORDINATOR_ADDRESS on every host) is the VM Google calls worker 0 of slice 0, here the
    last by name."""
    from tpuctl.core import state
    cloud.compute.workers_against_names = True
    code, out, err = cli("up", "--type", "tpu7x-16", "--slices", "2", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err

    def worker(inst):
        env = next(i["value"] for i in inst["metadata"]["items"] if i["key"] == "tpu-env")
        return int(env.split("TPU_WORKER_ID: '")[1].split("'")[0])
    slice0 = {k[2]: v for k, v in cloud.compute.instances.items() if k[2].startswith("tpuctl-ir-0-")}
    first_by_name, zero = min(slice0), next(n for n, v in slice0.items() if worker(v) == 0)
    assert first_by_name != zero   # the case the issue names: name order and worker order disagree
    assert state.load("ir").host.ip == slice0[zero]["networkInterfaces"][0]["networkIP"]
    assert cli("down", "-c", "ir", "--yes")[0] == 0


@pytest.mark.parametrize("tpu, policies", [("tpu7x-16", ["tpuctl-ir-0-wp", "tpuctl-ir-1-wp"]), ("tpu7x-8", [])])
def test_one_workload_policy_per_multi_host_slice_and_none_for_single_hosts(cloud, cli, tpu, policies):
    """As xpk and vllm-project/ci-infra's TPU7x modules do (GCE_TPU_FACTS "Corrections")."""
    code, out, err = cli("up", "--type", tpu, "--slices", "2", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    assert sorted(k[2] for k in cloud.compute.policies) == policies
    for k in (0, 1):
        m = cloud.compute.migs[(PROJECT, ZONE, f"tpuctl-ir-{k}")]["mig"]
        assert m.get("resourcePolicies", {}).get("workloadPolicy", "").rsplit("/", 1)[-1] == \
            (f"tpuctl-ir-{k}-wp" if policies else "")
    assert cli("down", "-c", "ir", "--yes")[0] == 0
    assert cloud.leaks() == []


def test_down_removes_the_one_policy_a_cluster_made_before_issue_59(cloud, cli):
    assert cli("up", "--type", "tpu7x-16", "--slices", "2", "--zone", ZONE, "-c", "ir", "--yes")[0] == 0
    old = dict(cloud.compute.policies[(PROJECT, "us-central1", "tpuctl-ir-0-wp")], name="tpuctl-ir-wp")
    cloud.compute.policies[(PROJECT, "us-central1", "tpuctl-ir-wp")] = old
    assert cli("down", "-c", "ir", "--yes")[0] == 0
    assert cloud.leaks() == []


def test_the_plan_says_how_long_a_flex_start_vm_waits(cloud, cli):
    code, out, err = cli("up", "--type", "tpu7x-8", "--flex-start", "--max-duration", "2h", "--flex-wait", "30m",
                         "--zone", ZONE, "-c", "ir", "--dry-run")
    assert code == 0 and "flex-start: waits for capacity up to 30m, deleted after 2h" in " ".join(err.split()), err
