"""TPUs through Compute Engine (`up --api compute`, and always TPU7x): the real CLI and google-cloud-compute against
the Compute fake (tests/fakes/compute_tpu.py), with simulated hosts booting from the VMs' start-up scripts."""
import json

import pytest
from conftest import PROJECT, until

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
    code, out, err = cli("up", "--type", "tpu7x-8", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    vm = cloud.compute.instances[(PROJECT, ZONE, "tpuctl-ir")]
    assert vm["machineType"] == f"zones/{ZONE}/machineTypes/tpu7x-standard-4t"
    assert vm["scheduling"] == {"onHostMaintenance": "TERMINATE"}
    assert vm["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert vm["disks"][0]["initializeParams"]["sourceImage"] == \
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"
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
    _hosts(cloud, monkeypatch)   # --max-duration: up waits for the hosts' word that they can end the compute
    code, out, err = cli("up", "--type", "v6e-16", "--api", "compute", "--flex-start", "--max-duration", "2h",
                         "--zone", "us-east5-a", "-c", "ir", "--yes")
    assert code == 0, err
    tpl = cloud.compute.templates[(PROJECT, "tpuctl-ir-template")]["properties"]
    assert tpl["machineType"] == "ct6e-standard-4t"
    assert tpl["scheduling"] == {"onHostMaintenance": "TERMINATE", "provisioningModel": "FLEX_START",
                                 "instanceTerminationAction": "DELETE", "maxRunDuration": {"seconds": "7200"}}
    m = cloud.compute.migs[(PROJECT, "us-east5-a", "tpuctl-ir")]["mig"]
    assert m["targetSize"] == 4 and m["targetSizePolicy"] == {"mode": "BULK"}
    assert m["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}
    assert cloud.compute.policies[(PROJECT, "us-east5", "tpuctl-ir-wp")]["workloadPolicy"]["acceleratorTopology"] \
        == "4x4"


def test_reservation_is_bound_and_specific(cloud, cli):
    code, out, err = cli("up", "--type", "tpu7x-8", "--reservation", "cal-1", "--zone", ZONE, "-c", "ir", "--yes")
    assert code == 0, err
    vm = cloud.compute.instances[(PROJECT, ZONE, "tpuctl-ir")]
    assert vm["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    assert vm["reservationAffinity"] == {"consumeReservationType": "SPECIFIC_RESERVATION",
                                         "key": "compute.googleapis.com/reservation-name", "values": ["cal-1"]}


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


@pytest.mark.parametrize("agent_worker_number", [False, True], ids=["tpu-env-only", "with-agent-worker-number"])
def test_multi_host_workers_learn_their_ids_from_metadata(cloud, cli, tmp_path, monkeypatch, agent_worker_number):
    hosts = _hosts(cloud, monkeypatch)
    cloud.compute.agent_worker_number = agent_worker_number
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


def test_a_missing_compute_permission_stops_up_before_anything_is_made(cloud, cli):
    from fakes.resource_manager import OTHER_PERMISSIONS, TPU_PERMISSIONS
    cloud.iam.held = set(TPU_PERMISSIONS + OTHER_PERMISSIONS) - {"compute.instanceGroupManagers.create"}
    code, out, err = cli("up", "--type", "tpu7x-16", "--zone", ZONE, "-c", "ir", "--yes")
    assert code != 0 and "compute.instanceGroupManagers.create" in err and "roles/compute.instanceAdmin.v1" in err
    assert cloud.mutating_calls() == []


@pytest.mark.parametrize("tpu, gone", [("tpu7x-8", "instance"), ("tpu7x-16", "mig")])
def test_autostop_the_host_deletes_its_vm_or_mig_then_down_removes_the_rest(live_hosts, cloud, cli, tpu, gone):
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


@pytest.mark.slow(35)
def test_every_request_body_has_only_fields_the_compute_api_has(cloud, cli, monkeypatch):
    """Each body tpuctl sent, read from the fake, against google-cloud-compute's compute_v1 messages (their JSON
    names are the wire's: the discovery document's camelCase)."""
    from google.cloud import compute_v1
    _hosts(cloud, monkeypatch)   # --max-duration: up waits for the hosts' word that they can end the compute
    for k, flags in enumerate([["--type", "tpu7x-8", "--spot"], ["--type", "tpu7x-16", "--reservation", "r1"],
                               ["--type", "v6e-16", "--api", "compute", "--flex-start", "--max-duration", "1h"],
                               ["--type", "v6e-8", "--api", "compute", "--slices", "2"]]):
        zone = ZONE if "tpu7x" in flags[1] else "us-east5-a"
        code, out, err = cli("up", *flags, "--zone", zone, "-c", f"f{k}", "--yes")
        assert code == 0, err
    seen = set()
    for action, body in cloud.compute.bodies:
        if action not in BODY_TYPES:
            continue
        seen.add(action)
        message = getattr(compute_v1, BODY_TYPES[action]).pb().DESCRIPTOR
        assert _unknown_fields(body, message) == [], (action, body)
    assert seen >= {"insert", "tpl_insert", "rp_insert", "mig_insert"}
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
