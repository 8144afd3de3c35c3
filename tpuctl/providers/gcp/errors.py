"""One classification table from Google's error payloads to TpuctlError (GCP_FACTS §5 has the texts).

Rows are tried in order; the first whose pattern is found in "CODE: message" wins. Capacity texts come before the
generic 429/RESOURCE_EXHAUSTED row because a stockout arrives as gRPC code 8 (RESOURCE_EXHAUSTED, HTTP 429), e.g.
  8: There is no more capacity in the zone "us-central1-b"; you can try in another zone where Cloud TPU Nodes
     are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x...]
"""
from __future__ import annotations

import re

from typing import Any

from ...errors import ErrorKind, Scope, TpuctlError

_ENABLE = "gcloud services enable tpu.googleapis.com compute.googleapis.com storage.googleapis.com"

# (regex, kind, scope, retryable, hint)
TABLE: list[tuple[str, ErrorKind, Scope, bool, str]] = [
    (r"no more capacity in the zone|ZONE_RESOURCE_POOL_EXHAUSTED|does not have enough resources available",
     ErrorKind.CAPACITY, Scope.ZONE, False, "the zone is out of capacity: add more --zone values, try --spot, or retry later"),
    (r"Quota '[^']*' exhausted.*in region|QUOTA_EXCEEDED.*region",
     ErrorKind.CAPACITY, Scope.REGION, False, "request more TPU quota for this region in the console, or pick a zone elsewhere"),
    (r"Quota '[^']*' exhausted|QUOTA_EXCEEDED",
     ErrorKind.CAPACITY, Scope.ZONE, False, "request more TPU quota in the console (IAM & Admin > Quotas), or pick another zone"),
    (r"Insufficient reserved capacity",
     ErrorKind.CAPACITY, Scope.ZONE, False, "the reservation is full: drop the reservation, use --spot, or try another zone"),
    (r"accelerator \S+ was not found in zone|accelerator type .* not (found|available)",
     ErrorKind.INPUT, Scope.ZONE, False, "this zone does not offer that type: `tpuctl up --help` lists zones per type"),
    (r"LOCATION_POLICY_VIOLATED",
     ErrorKind.PERMISSION, Scope.REGION, False, "your organisation or project may not use this region; pick a zone in another"),
    (r"SERVICE_DISABLED|has not been used in project|it is disabled",
     ErrorKind.PERMISSION, Scope.GLOBAL, False, f"enable the APIs: {_ENABLE} --project PROJECT"),
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
    (r"^(409|ALREADY_EXISTS)\b", ErrorKind.ERROR, Scope.GLOBAL, False, "the name is taken; run the same command again to adopt it"),
    (r"^(429|500|502|503|504|UNAVAILABLE|DEADLINE_EXCEEDED|INTERNAL|RESOURCE_EXHAUSTED|ABORTED)\b|rateLimitExceeded"
     r"|Connection (reset|refused|aborted)|timed out",
     ErrorKind.ERROR, Scope.GLOBAL, True, "Google Cloud answered with a passing error; run the same command again"),
    (r"^(400|INVALID_ARGUMENT|FAILED_PRECONDITION)\b", ErrorKind.INPUT, Scope.GLOBAL, False, "check the flags you passed"),
]
_COMPILED = [(re.compile(p), kind, scope, retryable, hint) for p, kind, scope, retryable, hint in TABLE]


def _code_and_message(exc: BaseException) -> tuple[str, str]:
    from google.api_core import exceptions as gexc
    if isinstance(exc, gexc.GoogleAPICallError):
        code = ""
        if exc.grpc_status_code is not None:
            code = exc.grpc_status_code.name
        elif exc.code:
            code = str(exc.code)
        detail = " ".join(str(getattr(e, "get", lambda *_: "")("reason", "")) for e in (exc.errors or [])
                          if isinstance(e, dict))
        return code, f"{exc.message} {detail}".strip()
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
