"""The one error type tpuctl raises, its kinds, how far a failure reaches, and the exit code each kind maps to.

The CLI prints `message` and `hint` (no traceback) and exits with `ExitCode.of(kind)`. `scope` tells the
flows (control/up.py) how far a capacity-like failure reaches: ZONE means the next zone may work, REGION means every zone of
that region is out, GLOBAL means no other placement will help.
"""
from __future__ import annotations

import re

from enum import Enum, IntEnum


class ErrorKind(str, Enum):
    ERROR = "error"              # anything not classified below
    INPUT = "input"              # bad flag, name, type, zone, config: nothing was called
    NOT_FOUND = "not_found"      # the cluster or run does not exist
    CAPACITY = "capacity"        # stockout, quota or reservation in every zone tried
    PERMISSION = "permission"    # credentials, IAM, disabled API, restricted region
    REFUSED = "refused"          # Google refuses the request as such (TPU Node retired)
    PREEMPTED = "preempted"      # the TPU was preempted or terminated
    TIMEOUT = "timeout"          # a wait ran past its deadline
    HOST_LOST = "host_lost"      # a followed run's host is gone, or silent past the limit
    INTERRUPTED = "interrupted"  # Ctrl-C


class Scope(str, Enum):
    """How far a failure reaches, which decides zone failover."""
    ZONE = "zone"
    REGION = "region"
    GLOBAL = "global"


class ExitCode(IntEnum):
    """The process exit codes; docs/troubleshooting.md's table lists exactly these (a test compares them)."""
    OK = 0
    ERROR = 1
    INPUT = 2
    NOT_FOUND = 3
    CAPACITY = 4
    PERMISSION = 5
    REFUSED = 6
    PREEMPTED = 7
    TIMEOUT = 8
    HOST_LOST = 9
    INTERRUPTED = 130

    @classmethod
    def of(cls, kind: ErrorKind) -> "ExitCode":
        return cls[kind.name]


class TpuctlError(Exception):
    def __init__(self, kind: ErrorKind, message: str, hint: str = "", scope: Scope = Scope.GLOBAL,
                 retryable: bool = False):
        super().__init__(message)
        self.kind = ErrorKind(kind)
        self.message = message
        self.hint = hint
        self.scope = Scope(scope)
        self.retryable = retryable

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.of(self.kind)

    def __str__(self) -> str:
        return self.message


def bad_input(message: str, hint: str = "") -> TpuctlError:
    return TpuctlError(ErrorKind.INPUT, message, hint)


_DISABLED = re.compile(r"apis/api/([a-z0-9.-]+\.googleapis\.com)|\"service\":\s*\"([a-z0-9.-]+\.googleapis\.com)\"")


def disabled_api(status: int, payload: str) -> str:
    """The service a Google answer says is not enabled in the project, else "". Google answers 403 PERMISSION_DENIED
    "Cloud Resource Manager API has not been used in project N before or it is disabled. Enable it by visiting
    https://console.developers.google.com/apis/api/cloudresourcemanager.googleapis.com/overview?project=N then
    retry." (googleapis/python-resource-manager#129), with an ErrorInfo whose reason is SERVICE_DISABLED and whose
    metadata names the service (cloud.google.com/apis/design/errors). Shared by the CLI and the host, which read
    such answers with different clients."""
    if status != 403 or not ("SERVICE_DISABLED" in payload or "has not been used in project" in payload):
        return ""
    m = _DISABLED.search(payload)
    return (m.group(1) or m.group(2)) if m else ""
