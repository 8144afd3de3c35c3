"""One classification table from Google's error payloads to TpuctlError (GCP_FACTS §5 has the texts).

Google puts the decisive word in different places, so the text a row is matched against is
"CODE: message [reason ...]", where the reasons come from every place a payload carries them:
- gRPC errors: google.rpc.ErrorInfo in the status details, which google-api-core parses into `exc.reason` and
  `exc.details` (api_core/exceptions.py `_parse_grpc_error_details`). A restricted region, for one, answers
      PERMISSION_DENIED: Permission denied on 'locations/us-central2-b' (or it may not exist).
  with LOCATION_POLICY_VIOLATED only in the ErrorInfo (GCP_FACTS §5).
- a failed long-running operation: its google.rpc.Status, passed as `exc.errors[0]`, with Any-packed details.
- JSON/REST errors (Compute, Storage): `error.errors[].reason` (e.g. `quotaExceeded`, `rateLimitExceeded`) and
  ErrorInfo dicts in `error.details`, which api-core exposes as `exc.errors` / `exc.details`.
Rows are tried in order; the first match wins. Capacity rows come before the generic 429/RESOURCE_EXHAUSTED row
(a stockout arrives as gRPC code 8, HTTP 429) and quota rows before the generic 403 row (Compute answers quota as
403 `quotaExceeded`).
"""
from __future__ import annotations

import re
from typing import Any

from ...core.errors import ErrorKind, Scope, TpuctlError

_ENABLE = ("gcloud services enable tpu.googleapis.com compute.googleapis.com storage.googleapis.com "
           "cloudresourcemanager.googleapis.com")
_QUOTA_HINT = "request more quota in the console (IAM & Admin > Quotas), or pick a zone in another region"

# (regex, kind, scope, retryable, hint)
TABLE: list[tuple[str, ErrorKind, Scope, bool, str]] = [
    # TPU stockout, code 8: There is no more capacity in the zone "us-central1-b"; you can try in another zone ...
    # Compute stockout: ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]
    (r"no more capacity in the zone|ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources available",
     ErrorKind.CAPACITY, Scope.ZONE, False,
     "the zone is out of capacity: add more --zone values, try --spot, or retry later"),
    # 429: Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region
    # us-east5. (marin-community/marin PR #1612). Not a passing error: retrying cannot help, another region can.
    (r"Quota limit '[^']*' has been exceeded\..*in region", ErrorKind.CAPACITY, Scope.REGION, False, _QUOTA_HINT),
    (r"Quota limit '[^']*' has been exceeded", ErrorKind.CAPACITY, Scope.ZONE, False, _QUOTA_HINT),
    # TPU: Quota 'TPUV3PodPerProjectPerZoneForTPUAPI' exhausted. Limit 0 in zone us-central1-b
    # Compute (403, reason quotaExceeded): Quota 'CPUS' exceeded. Limit: 24.0 in region us-central1.
    (r"Quota '[^']*' (exhausted|exceeded).*in region|QUOTA_EXCEEDED.*region",
     ErrorKind.CAPACITY, Scope.REGION, False, _QUOTA_HINT),
    (r"Quota '[^']*' (exhausted|exceeded)|QUOTA_EXCEEDED|\bquotaExceeded\b",
     ErrorKind.CAPACITY, Scope.ZONE, False, _QUOTA_HINT),
    # Code 8 "Insufficient reserved capacity. Contact customer support..." also answers requests that named no
    # reservation (skypilot-org/skypilot#4579): it is a stockout, not a sign that a reservation was used.
    (r"Insufficient reserved capacity",
     ErrorKind.CAPACITY, Scope.ZONE, False,
     "Google has no capacity for this type here (it says 'reserved' even when no reservation was asked for): add "
     "more --zone values, try --spot or --queued, or retry later"),
    (r"accelerator \S+ was not found in zone|accelerator type .* not (found|available)",
     ErrorKind.INPUT, Scope.ZONE, False, "this zone does not offer that type: try a zone from Google's TPU regions page"),
    # In the ErrorInfo reason only (see above): the organisation's location policy forbids the region.
    (r"LOCATION_POLICY_VIOLATED",
     ErrorKind.PERMISSION, Scope.REGION, False, "your organisation or project may not use this region; pick a zone in another"),
    (r"SERVICE_DISABLED|has not been used in project|it is disabled",
     ErrorKind.PERMISSION, Scope.GLOBAL, False, f"enable the APIs: {_ENABLE} --project PROJECT"),
    # 400 FAILED_PRECONDITION (SkyPilot PR #5593): Your request to provision TPU Node has been denied. Please
    # migrate to TPU VM Architecture ...
    (r"provision TPU Node has been denied|migrate to TPU VM",
     ErrorKind.REFUSED, Scope.GLOBAL, False, "Google no longer creates TPU Nodes: use --arch vm (TPU VM, the default)"),
    (r"PREEMPTED|TERMINATED",
     ErrorKind.PREEMPTED, Scope.GLOBAL, False, "the TPU was preempted; `tpuctl up` again recreates it"),
    (r"^(401|UNAUTHENTICATED)\b|invalid_grant|Reauthentication",
     ErrorKind.PERMISSION, Scope.GLOBAL, False, "run `gcloud auth application-default login`"),
    (r"^(403|PERMISSION_DENIED)\b",
     ErrorKind.PERMISSION, Scope.GLOBAL, False,
     "your account needs roles/tpu.admin, roles/compute.instanceAdmin.v1, roles/storage.admin and "
     "roles/iam.serviceAccountUser on the project"),
    (r"^(404|NOT_FOUND)\b", ErrorKind.NOT_FOUND, Scope.GLOBAL, False, ""),
    (r"^(409|ALREADY_EXISTS)\b", ErrorKind.ERROR, Scope.GLOBAL, False,
     "the name is taken; run the same command again to adopt it"),
    (r"^(429|500|502|503|504|UNAVAILABLE|DEADLINE_EXCEEDED|INTERNAL|RESOURCE_EXHAUSTED|ABORTED)\b|rateLimitExceeded"
     r"|Connection (reset|refused|aborted)|timed out",
     ErrorKind.ERROR, Scope.GLOBAL, True, "Google Cloud answered with a passing error; run the same command again"),
    (r"^(400|INVALID_ARGUMENT|FAILED_PRECONDITION)\b", ErrorKind.INPUT, Scope.GLOBAL, False, "check the flags you passed"),
]
_COMPILED = [(re.compile(p), kind, scope, retryable, hint) for p, kind, scope, retryable, hint in TABLE]


def _reasons_of_status(status: Any) -> list[str]:
    """ErrorInfo reasons packed into a google.rpc.Status (a failed long-running operation's error)."""
    from google.rpc import error_details_pb2, status_pb2
    if not isinstance(status, status_pb2.Status):   # e.g. the grpc.Call that gRPC errors also carry
        return []
    out = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if hasattr(detail, "Is") and detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
            out.append(info.reason)
    return out


def _reasons(exc: Any) -> list[str]:
    """Every reason a google-api-core exception carries, wherever the API put it."""
    out = [exc.reason] if exc.reason else []
    for d in list(exc.details or []) + list(exc.errors or []):
        if isinstance(d, dict):
            out += [str(d[k]) for k in ("reason",) if d.get(k)]
        elif hasattr(d, "reason") and isinstance(d.reason, str):
            out.append(d.reason)
        else:
            out += _reasons_of_status(d)
    return [r for i, r in enumerate(out) if r and r not in out[:i]]


def _code_and_message(exc: BaseException) -> tuple[str, str]:
    from google.api_core import exceptions as gexc
    if isinstance(exc, gexc.GoogleAPICallError):
        code = ""
        if exc.grpc_status_code is not None:
            code = exc.grpc_status_code.name
        elif exc.code:
            code = str(exc.code)
        return code, " ".join([exc.message or "", *_reasons(exc)]).strip()
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return "UNAVAILABLE", str(exc)
    return type(exc).__name__, str(exc)


def classify_text(code: str, message: str, what: str = "request") -> TpuctlError:
    text = f"{code}: {message}"
    for rx, kind, scope, retryable, hint in _COMPILED:
        if rx.search(text):
            return TpuctlError(kind, f"{what} failed: {_first_line(message) or code}", hint, scope, retryable)
    return TpuctlError(ErrorKind.ERROR, f"{what} failed: {code} {_first_line(message)}".strip(),
                       "run again with TPUCTL_DEBUG=1 for details")


def classify(exc: BaseException, what: str = "request") -> TpuctlError:
    if isinstance(exc, TpuctlError):
        return exc
    code, message = _code_and_message(exc)
    return classify_text(code, message, what)


def _first_line(s: str) -> str:
    return (s or "").strip().splitlines()[0][:300] if (s or "").strip() else ""
