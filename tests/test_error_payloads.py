"""Errors built the way Google's APIs send them (status code, message, ErrorInfo reason in the details or the
JSON `errors[].reason`), through the real clients, each driving the failover it should."""
import json

import pytest
import requests

from tpuctl.core import state
from tpuctl.core.errors import ErrorKind, Scope
from tpuctl.providers.google.errors import classify

pytestmark = pytest.mark.usefixtures("no_leak")   # every test ends with nothing of tpuctl left

V3_ZONES = "us-central1-a,us-central1-b,europe-west4-a"


def _creates(cloud, version=2):
    return [c[2].split("/")[3] for c in cloud.tpu.mutating_calls() if c[1] == "CreateNode" and c[0] == version]


def test_location_policy_in_errorinfo_only_skips_the_region(cloud, cli):
    # The message says only "permission denied"; LOCATION_POLICY_VIOLATED is the ErrorInfo reason (GCP_FACTS §5).
    cloud.tpu.faults["CreateNode"].append(("PERMISSION_DENIED", "Permission denied on 'locations/us-central1-a' "
                                           "(or it may not exist).", "LOCATION_POLICY_VIOLATED"))
    code, out, err = cli("up", "--type", "v3-8", "--zone", V3_ZONES, "-c", "bert")
    assert code == 0, err
    assert _creates(cloud) == ["us-central1-a", "europe-west4-a"]
    assert state.load("bert").zone == "europe-west4-a"


def test_location_policy_in_a_failed_operation_skips_the_region(cloud, cli):
    cloud.tpu.op_faults["CreateNode"].append((7, "Permission denied on 'locations/us-central1-a' (or it may not "
                                              "exist).", "LOCATION_POLICY_VIOLATED"))
    code, out, err = cli("up", "--type", "v3-8", "--zone", V3_ZONES, "-c", "bert")
    assert code == 0, err
    assert _creates(cloud) == ["us-central1-a", "europe-west4-a"]


@pytest.mark.parametrize("where,landed,creates", [
    ("region us-central1", "europe-west4-a", ["us-central1-a", "europe-west4-a"]),
    ("zone us-central1-a", "us-central1-b", ["us-central1-a", "us-central1-b"]),
])
def test_quota_limit_429_fails_over_without_retrying(cloud, cli, where, landed, creates):
    # HTTP 429 / RESOURCE_EXHAUSTED "Quota limit '...' has been exceeded. Limit: 0 in region R." (marin-community/
    # marin PR #1612); the reason is the one AIP-193 names for quota, RATE_LIMIT_EXCEEDED.
    cloud.tpu.faults["CreateNode"].append(("RESOURCE_EXHAUSTED", "Quota limit 'TPUV3DevicePerProjectPerRegionForTPUAPI'"
                                           f" has been exceeded. Limit: 0 in {where}.", "RATE_LIMIT_EXCEEDED"))
    code, out, err = cli("up", "--type", "v3-8", "--zone", V3_ZONES, "-c", "bert")
    assert code == 0, err
    assert _creates(cloud) == creates          # one attempt where the quota is out: no retry
    assert state.load("bert").zone == landed


@pytest.mark.tpu_nodes
def test_compute_quota_403_fails_over_to_another_region_and_removes_the_tpu(cloud, cli):
    # Compute's synchronous quota answer: HTTP 403, reason quotaExceeded (GCP_FACTS §5).
    cloud.compute.faults["insert"].append((403, "quotaExceeded", "Quota 'CPUS' exceeded. Limit: 24.0 in region "
                                           "us-central1."))
    code, out, err = cli("up", "--type", "v2-8", "--arch", "node", "--zone", "us-central1-b,us-central1-c,europe-west4-a",
                         "-c", "bert")
    assert code == 0, err
    assert [n.split("/")[3] for n in cloud.tpu.nodes[1]] == ["europe-west4-a"]
    assert [k[1] for k in cloud.compute.instances] == ["europe-west4-a"]
    assert "us-central1-c" not in _creates(cloud, 1)


@pytest.mark.parametrize("status", ["FAILED_PRECONDITION", "INVALID_ARGUMENT"])
@pytest.mark.tpu_nodes
def test_tpu_node_denial(cloud, cli, status):
    # SkyPilot PR #5593: 400 FAILED_PRECONDITION "Your request to provision TPU Node has been denied ..."; the text
    # decides, whatever the code (GCP_FACTS §1 saw it as a plain 400 too)
    cloud.tpu.faults["CreateNode"].append((status, "Your request to provision TPU Node has been denied. Please migrate "
                                           "to TPU VM Architecture: https://cloud.google.com/tpu/docs/system-architecture-tpu-vm"))
    code, out, err = cli("up", "--type", "v3-8", "--zone", "us-central1-b", "--arch", "node", "-c", "bert")
    assert code == 6, err
    assert "--arch vm" in err
    assert not cloud.compute.instances and not cloud.tpu.nodes[1]


def _http_error(status, body):
    from google.api_core import exceptions
    r = requests.Response()
    r.status_code = status
    r._content = json.dumps(body).encode()
    r.request = requests.Request("POST", "https://compute.googleapis.com/x").prepare()
    return exceptions.from_http_response(r)


@pytest.mark.parametrize("status,body,expect", [
    (403, {"error": {"code": 403, "message": "Quota 'CPUS' exceeded. Limit: 24.0 in region us-central1.",
                     "errors": [{"message": "Quota 'CPUS' exceeded.", "domain": "usageLimits",
                                 "reason": "quotaExceeded"}]}}, (ErrorKind.CAPACITY, Scope.REGION, False)),
    (403, {"error": {"code": 403, "message": "Required 'compute.instances.create' permission",
                     "errors": [{"reason": "forbidden"}]}}, (ErrorKind.PERMISSION, Scope.GLOBAL, False)),
    (403, {"error": {"code": 403, "message": "Permission denied on 'locations/us-central2-b' (or it may not exist).",
                     "status": "PERMISSION_DENIED", "details": [
                         {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "LOCATION_POLICY_VIOLATED",
                          "domain": "googleapis.com"}]}}, (ErrorKind.PERMISSION, Scope.REGION, False)),
    (429, {"error": {"code": 429, "message": "Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been "
                     "exceeded. Limit: 0 in region us-east5.", "status": "RESOURCE_EXHAUSTED"}},
     (ErrorKind.CAPACITY, Scope.REGION, False)),
    (429, {"error": {"code": 429, "message": "Rate Limit Exceeded", "errors": [{"reason": "rateLimitExceeded"}]}},
     (ErrorKind.ERROR, Scope.GLOBAL, True)),
    (400, {"error": {"code": 400, "message": "Your request to provision TPU Node has been denied. Please migrate to "
                     "TPU VM Architecture", "status": "FAILED_PRECONDITION"}}, (ErrorKind.REFUSED, Scope.GLOBAL, False)),
])
def test_rest_payloads_as_sent(status, body, expect):
    e = classify(_http_error(status, body))
    assert (e.kind, e.scope, e.retryable) == expect


def test_a_denied_tpu_node_says_googles_words_and_never_makes_the_vm(cloud, cli):
    """The default fake answers v1 CreateNode as Google does today (no TPU Node access): one line with Google's own
    words and the way out, and the companion VM is asked for only after Google accepted the node, so never here."""
    code, out, err = cli("up", "--type", "v2-8", "--zone", "us-central1-b", "--arch", "node", "-c", "old")
    assert code == 6, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    assert "provision TPU Node has been denied" in lines[0] and "migrate to TPU VM Architecture" in lines[0], err
    assert "--arch vm" in err and "Traceback" not in err
    assert not [c for c in cloud.compute.calls if "insert" in str(c)], cloud.compute.calls
    assert not cloud.compute.instances and not cloud.tpu.nodes[1]
