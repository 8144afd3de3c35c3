"""A Google Cloud host ends its own compute (issue 12): the agent on the simulated TPU VM (or the legacy node's VM)
deletes it through the fake APIs' REST front as its own identity, which the fake project IAM authorises; the CLI
deletes nothing. Autostop is called armed only on the host's own word."""
import json
import time
import urllib.error
import urllib.request

import pytest
from conftest import PROJECT, until

from jobs import make_job
from tpuctl.core import state

pytestmark = pytest.mark.usefixtures("no_leak")   # every test ends with nothing of tpuctl left

SA = f"trainer@{PROJECT}.iam.gserviceaccount.com"
DEFAULT_SA = "424242-compute@developer.gserviceaccount.com"


def _agents_said(hosts):
    return [h.agent_out() for hs in hosts.hosts.values() for h in hs]


def _host_deletions(cloud):
    return [(path, who) for method, path, who in cloud.tpu.rest_calls if method == "DELETE"]


def test_autostop_fires_on_the_host_which_deletes_its_own_tpu(live_hosts, cloud, cli):
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "auto", "--autostop", "3s")
    assert code == 0, err
    assert f"armed: enforced by the host, as {DEFAULT_SA}" in err
    name = f"projects/{PROJECT}/locations/us-central1-b/nodes/tpuctl-auto"
    until(lambda: name not in cloud.tpu.nodes[2], 60, lambda: _agents_said(live_hosts))
    # the host asked, as its own identity; the CLI never called DeleteNode over gRPC
    assert _host_deletions(cloud) == [(f"/v2/{name}", f"serviceAccount:{DEFAULT_SA}")]
    assert [c for c in cloud.tpu.calls if c[1] == "DeleteNode"] == [(2, "DeleteNode", name)]
    info = json.loads(cli("status", "-c", "auto", "--json")[1])
    assert info["phase"] == "stopped" and info["stopped"].startswith("autostop: no run for 3s")
    assert state.load("auto").periods[-1][1] > 0                 # the cost stopped counting
    assert json.loads(cli("ls", "--json")[1])[0]["phase"].startswith("stopped ")
    assert cli("down", "-c", "auto", "--yes")[0] == 0


def test_submit_down_on_gcp_the_host_deletes_its_tpu_after_the_run(live_hosts, cloud, cli, tmp_path):
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "sd")[0] == 0
    job = make_job(tmp_path, "print('trained')")
    code, out, err = cli("submit", str(job), "-c", "sd", "--down")
    assert code == 0 and "trained" in out, err
    name = f"projects/{PROJECT}/locations/us-central1-b/nodes/tpuctl-sd"
    until(lambda: name not in cloud.tpu.nodes[2], 60, "the TPU's deletion")
    assert _host_deletions(cloud) == [(f"/v2/{name}", f"serviceAccount:{DEFAULT_SA}")]
    assert "(submit --down)" in json.loads(cli("status", "-c", "sd", "--json")[1])["stopped"]


@pytest.mark.tpu_nodes
def test_the_legacy_nodes_vm_deletes_the_node_then_itself(live_hosts, cloud, cli):
    code, out, err = cli("up", "--type", "v2-8", "--zone", "us-central1-b", "--arch", "node", "-c", "nd",
                         "--max-duration", "4s")
    assert code == 0, err
    until(lambda: not cloud.compute.instances and not cloud.tpu.nodes[1], 60, "the VM and the TPU Node's deletion")
    node = f"projects/{PROJECT}/locations/us-central1-b/nodes/tpuctl-nd"
    assert _host_deletions(cloud) == [(f"/v1/{node}", f"serviceAccount:{DEFAULT_SA}")]
    assert [c for c in cloud.compute.calls if c[0] == "delete"] == [
        ("delete", f"/compute/v1/projects/{PROJECT}/zones/us-central1-b/instances/tpuctl-nd-vm")]
    assert "max-duration deadline" in json.loads(cli("status", "-c", "nd", "--json")[1])["stopped"]


def _rest_delete(cloud, name, email):
    """A DELETE as `email`'s metadata token would carry it, straight to the fake TPU's REST front."""
    base = cloud.hosts.env["TPU_REST_EMULATOR_HOST"]
    req = urllib.request.Request(f"{base}/v2/{name}", method="DELETE",
                                 headers={"Authorization": f"Bearer token-of-{email}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.slow(40)
def test_an_identity_without_tpu_delete_is_refused_never_shown_armed(live_hosts, cloud, cli):
    # The narrow grant one would want: roles/tpu.admin on this TPU only. The TPU API knows no resource attributes
    # (iam/docs/conditions-resource-attributes), so it grants nothing, and the host must say so.
    name = f"projects/{PROJECT}/locations/us-central1-b/nodes/tpuctl-na"
    cloud.iam.bindings.append({"role": "roles/tpu.admin", "members": [f"serviceAccount:{SA}"],
                               "condition": {"expression": f'resource.name == "{name}"'}})
    # The host retries its refused deletion every 20 s here, not every 0.5 s: with the fix granted below, a retry
    # landing before `up -c na` has the host's new report deletes the TPU under that `up` (a race of the test's
    # making, seen once the suite ran slower)
    cloud.hosts.env["TPUCTL_TEARDOWN_RETRY"] = "20"
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "na", "--autostop", "2s",
                         "--service-account", SA)
    assert code == 5, err
    assert f"the host's identity {SA} lacks tpu.nodes.delete in project {PROJECT}" in err
    assert f"--member=serviceAccount:{SA} --role=roles/tpu.admin" in err and "every TPU" in err
    info = json.loads(cli("status", "-c", "na", "--json")[1])
    assert info["phase"] == "ready" and "NOT ENFORCED" in info["autostop"]
    assert name in cloud.tpu.nodes[2]                            # up and billing, and said so: nothing deleted
    assert _rest_delete(cloud, name, SA) == 403                  # the conditional grant indeed does not work
    time.sleep(3)                                                # autostop is due now: the host tries, is refused
    assert name in cloud.tpu.nodes[2]
    assert "NOT ENFORCED" in json.loads(cli("status", "-c", "na", "--json")[1])["autostop"]

    cloud.iam.bindings.append({"role": "roles/tpu.admin", "members": [f"serviceAccount:{SA}"]})   # the fix
    code, out, err = cli("up", "-c", "na")                       # asks the host again: armed now
    assert code == 0 and f"armed: enforced by the host, as {SA}" in err, err
    until(lambda: name not in cloud.tpu.nodes[2], 60, "the overdue autostop")
    assert _host_deletions(cloud)[-1] == (f"/v2/{name}", f"serviceAccount:{SA}")


def test_the_fake_apis_authenticate_the_host(cloud):
    name = f"projects/{PROJECT}/locations/us-central1-b/nodes/x"
    base = cloud.hosts.env["TPU_REST_EMULATOR_HOST"]
    req = urllib.request.Request(f"{base}/v2/{name}", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401
    assert _rest_delete(cloud, name, "nobody@x.iam.gserviceaccount.com") == 403
    assert _rest_delete(cloud, name, DEFAULT_SA) == 404          # allowed, but there is no such node


# -- asked before anything is made (issue 19): the API off, or an identity with no role that can delete ------------
@pytest.fixture
def short_arm(monkeypatch):
    monkeypatch.setenv("TPUCTL_TEARDOWN_WAIT", "3")   # without the check up would wait this long for a host, then fail


def test_autostop_with_resource_manager_off_says_so_and_makes_nothing(cloud, cli, short_arm):
    cloud.iam.disabled = True
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "rm", "--autostop", "1h", "--yes")
    assert code == 5, err
    assert "the cloudresourcemanager.googleapis.com API is disabled" in err
    assert f"gcloud services enable cloudresourcemanager.googleapis.com --project {PROJECT}" in err
    assert "roles/tpu.admin" not in err                          # not mistaken for a missing grant
    assert cloud.mutating_calls() == [] and state.load("rm") is None


def test_without_autostop_resource_manager_off_never_blocks_up(cloud, cli):
    cloud.iam.disabled = True
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "rm", "--yes")
    assert code == 0, err
    assert "the cloudresourcemanager.googleapis.com API is disabled" in err   # said, as a warning


def test_a_default_account_without_editor_is_refused_before_any_tpu_exists(cloud, cli, short_arm):
    cloud.iam.withhold_default_editor()   # an organisation that keeps basic roles from default accounts
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "lock", "--max-duration", "8h",
                         "--yes")
    assert code == 5, err
    assert f"{DEFAULT_SA}, the identity the TPU would run as, holds no role with tpu.nodes.delete" in err
    assert (f"gcloud projects add-iam-policy-binding {PROJECT} --member=serviceAccount:{DEFAULT_SA} "
            "--role=roles/tpu.admin") in err
    assert cloud.mutating_calls() == [] and not cloud.tpu.nodes[2]


def test_what_the_project_policy_cannot_decide_is_left_to_the_host():
    from tpuctl.providers.google.permissions import judge
    sa = "serviceAccount:a@p.iam.gserviceaccount.com"
    need = ["tpu.nodes.delete"]
    assert judge([{"role": "roles/editor", "members": [sa]}], sa, need) == ([], [])
    assert judge([{"role": "roles/logging.logWriter", "members": [sa]}], sa, need) == (need, [])
    assert judge([{"role": "roles/tpu.viewer", "members": [sa]}], sa, need) == (need, [])
    assert judge([{"role": "projects/p/roles/mine", "members": [sa]}], sa, need) == ([], need)   # custom
    assert judge([{"role": "roles/tpu.admin", "members": [sa], "condition": {"expression": "x"}}], sa, need) == \
        ([], need)
    assert judge([{"role": "roles/tpu.admin", "members": ["user:b@x"]}], sa, need) == (need, [])


def test_a_host_that_cannot_ask_says_which_api_is_off(live_hosts, cloud, cli, tmp_path):
    cloud.iam.disabled = True
    assert cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "off", "--yes")[0] == 0
    code, out, err = cli("submit", str(make_job(tmp_path, "print('never')")), "-c", "off", "--down")
    assert code == 5, err
    assert "the host cannot check what its identity" in err and "cloudresourcemanager.googleapis.com API is" in err
    assert "gcloud services enable cloudresourcemanager.googleapis.com" in err and "lacks" not in err


@pytest.mark.parametrize("unknown", ["invalid", "not_held"])
def test_a_queued_tpu_admin_host_is_armed_and_deletes_its_request(live_hosts, cloud, cli, unknown):
    """TPU Admin's permissions hold no queued-resource one (Google's Cloud TPU roles page), so a host whose identity
    holds roles/tpu.admin alone must be armed for a queued cluster and delete its request; asking IAM about a name it
    does not list is refused (400) or answered as not held, and neither may leave autostop unenforced."""
    cloud.iam.unknown_permissions = unknown
    cloud.iam.bindings.append({"role": "roles/tpu.admin", "members": [f"serviceAccount:{SA}"]})
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "qa", "--queued", "--autostop",
                         "3s", "--service-account", SA)
    assert code == 0, err
    assert f"armed: enforced by the host, as {SA}" in err
    qr = f"projects/{PROJECT}/locations/us-central1-b/queuedResources/tpuctl-qa-qr"
    until(lambda: qr not in cloud.tpu.queued, 60, lambda: _agents_said(live_hosts))
    assert _host_deletions(cloud)[0][0].startswith(f"/v2/{qr}") and _host_deletions(cloud)[0][1] == f"serviceAccount:{SA}"
    assert cli("down", "-c", "qa", "--yes")[0] == 0


def test_a_multislice_host_deletes_its_request_then_every_slice_by_name():
    """A Multislice has no node named <tpu_name>: its nodes are <tpu_name>-0 .. -(N-1) (core/multislice.py)."""
    from tpuctl.core.models import ClusterSpec, ClusterState, ProviderName
    from tpuctl.providers.gcp.teardown import targets
    spec = ClusterSpec(name="ms", provider=ProviderName.GCP, project="p", tpu_type="v4-16", queued=True, slices=2)
    where = "projects/p/locations/us-central2-b"
    assert [(t["kind"], t["path"]) for t in targets(ClusterState(spec=spec, zone="us-central2-b"))] == [
        ("queued", f"v2/{where}/queuedResources/tpuctl-ms-qr?force=true"),
        ("node", f"v2/{where}/nodes/tpuctl-ms-0"), ("node", f"v2/{where}/nodes/tpuctl-ms-1")]
    one = ClusterSpec(name="one", provider=ProviderName.GCP, project="p", tpu_type="v3-8")
    assert [t["path"] for t in targets(ClusterState(spec=one, zone="us-central1-b"))] == [
        "v2/projects/p/locations/us-central1-b/nodes/tpuctl-one"]


@pytest.mark.parametrize("redelete", [None, (400, "FAILED_PRECONDITION")])
def test_autostop_on_a_multislice_deletes_its_request_and_every_slice(live_hosts, cloud, cli, redelete):
    """Worker 0 of slice 0 deletes the Multislice request with force, which takes its nodes first, then asks for
    each slice's node by its own name. How Google answers that while the node is already being deleted is not
    established (tests/fakes/tpu_server.py `redelete`): asked again or refused, the teardown is no failure."""
    zone = "us-central2-b"
    # slice 0's worker 0 alone reports, keeps the clock and deletes (host/autostop.py): the other three need not boot
    live_hosts.only = lambda resource, kind, worker: resource.endswith("/tpuctl-ms-0") and worker == 0
    code, out, err = cli("up", "--type", "v4-16", "--zone", zone, "--slices", "2", "-c", "ms", "--framework", "jax",
                         "--autostop", "3s", "--yes")
    assert code == 0 and "armed: enforced by the host" in err, err
    cloud.tpu.redelete = redelete
    cloud.tpu.delay = 2.0     # the forced deletion takes a while: the nodes are still DELETING when each is asked

    def gone():
        with cloud.tpu.lock:
            cloud.tpu._advance()   # operations finish lazily, on a request
            return cloud.tpu.queued == {} and cloud.tpu.nodes[2] == {}
    until(gone, 120, lambda: _agents_said(live_hosts))
    cloud.tpu.delay = 0.0
    where = f"projects/{PROJECT}/locations/{zone}"
    assert [path for path, who in _host_deletions(cloud)] == [
        f"/v2/{where}/queuedResources/tpuctl-ms-qr?force=true", f"/v2/{where}/nodes/tpuctl-ms-0",
        f"/v2/{where}/nodes/tpuctl-ms-1"]                          # once each: nothing failed, nothing retried
    info = json.loads(cli("status", "-c", "ms", "--json")[1])
    assert info["phase"] == "stopped" and info["stopped"].startswith("autostop: no run for 3s"), info
    assert cli("down", "-c", "ms", "--yes")[0] == 0


def test_up_that_waits_on_a_host_which_ended_its_compute_says_so(live_hosts, cloud, cli, monkeypatch):
    """The host's report for this `up` is lost on its way to the store (its one write refused), then its autostop
    falls due and it deletes its TPU: `up` ends in one line saying the host ended the compute and why, from the
    host's own record, not after TPUCTL_TEARDOWN_WAIT with "the host has not yet reported" (the race that
    test_an_identity_without_tpu_delete_is_refused_never_shown_armed dodges)."""
    monkeypatch.setenv("TPUCTL_TEARDOWN_WAIT", "90")
    report = f"POST /upload/storage/v1/b/{PROJECT}-tpuctl-gone/o tpuctl/teardown-check.json"
    cloud.gcs.faults[report].append((400, "invalid", "the report is lost"))
    began = time.monotonic()
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "-c", "gone", "--autostop", "2s")
    assert cloud.gcs.faults[report] == []                        # the host's one report was the write refused
    assert code == 3, err
    line = " ".join(err.split())                                 # the terminal may wrap it
    assert "the host ended cluster gone's compute at " in line and ": autostop: no run for 2s" in line, err
    assert "autostop, deadline and --down are not armed" in line and "tpuctl up -c gone` makes it again" in line
    said = err[err.index("error: "):]          # the CLI's own lines (a fake server may print a host's lost connection)
    assert said.count("\n") == 2 and "Traceback" not in said and "not yet reported" not in said, said
    assert time.monotonic() - began < 90
    assert json.loads(cli("status", "-c", "gone", "--json")[1])["phase"] == "stopped"
