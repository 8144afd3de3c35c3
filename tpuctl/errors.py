"""The one error type tpuctl raises, and the exit code each kind maps to.

The CLI prints `message` and `hint` (no traceback) and exits with `EXIT_CODES[kind]`. `scope` tells the
orchestrator how far a capacity-like failure reaches: "zone" means the next zone may work, "region" means
every zone of that region is out, "global" means no other zone will help.
"""
from __future__ import annotations

EXIT_CODES = {
    "error": 1,          # anything not classified below
    "input": 2,          # bad flag, name, type, zone, config: nothing was called
    "not_found": 3,      # the cluster or run does not exist
    "capacity": 4,       # stockout, quota or reservation in every zone tried
    "permission": 5,     # credentials, IAM, disabled API, restricted region
    "refused": 6,        # Google refuses the request as such (TPU Node retired)
    "preempted": 7,      # the TPU was preempted or terminated
    "timeout": 8,        # a wait ran past its deadline
    "interrupted": 130,  # Ctrl-C
}


class TpuctlError(Exception):
    def __init__(self, kind: str, message: str, hint: str = "", scope: str = "global", retryable: bool = False):
        if kind not in EXIT_CODES:
            raise ValueError(f"unknown error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.hint = hint
        self.scope = scope
        self.retryable = retryable

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.kind]

    def __str__(self) -> str:
        return self.message


def bad_input(message: str, hint: str = "") -> TpuctlError:
    return TpuctlError("input", message, hint)
