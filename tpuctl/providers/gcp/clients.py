"""The ONLY place endpoints and credentials are applied (GCP_FACTS §3).

TPU_EMULATOR_HOST=host:port          plaintext gRPC for tpu_v1 and tpu_v2
COMPUTE_EMULATOR_HOST=http://host:port   Compute REST
STORAGE_EMULATOR_HOST=http://host:port   honoured by google-cloud-storage itself
Any of them set means anonymous credentials for that API. Imports stay inside the functions: compute_v1 alone
costs ~3 s and `tpuctl --help` must not pay it.
"""
from __future__ import annotations

import functools
import os
from typing import Any

from ...core.errors import ErrorKind, TpuctlError


def _anonymous() -> Any:
    from google.auth.credentials import AnonymousCredentials
    return AnonymousCredentials()


@functools.lru_cache(maxsize=None)
def credentials() -> Any:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    try:
        creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError:
        raise TpuctlError(ErrorKind.PERMISSION, "no Google Cloud credentials found",
                          "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS)")
    return creds


@functools.lru_cache(maxsize=None)
def tpu(version: int) -> Any:
    import importlib
    mod = importlib.import_module(f"google.cloud.tpu_v{version}")
    host = os.environ.get("TPU_EMULATOR_HOST")
    if host:
        import grpc
        transport = mod.services.tpu.transports.TpuGrpcTransport(
            channel=grpc.insecure_channel(host), credentials=_anonymous())
        return mod.TpuClient(transport=transport)
    return mod.TpuClient(credentials=credentials())


@functools.lru_cache(maxsize=None)
def compute(kind: str) -> Any:
    """kind: InstancesClient, ZoneOperationsClient or ProjectsClient, all on the same endpoint."""
    from google.cloud import compute_v1
    cls = getattr(compute_v1, kind)
    host = os.environ.get("COMPUTE_EMULATOR_HOST")
    if host:
        return cls(credentials=_anonymous(), client_options={"api_endpoint": host})
    return cls(credentials=credentials())


@functools.lru_cache(maxsize=None)
def storage(project: str | None) -> Any:
    import google.cloud.storage as gcs
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return gcs.Client(project=project, credentials=_anonymous())
    return gcs.Client(project=project, credentials=credentials())


def has_credentials() -> bool:
    """Whether the TPU API can be asked now (an emulator, or Application Default Credentials)."""
    if os.environ.get("TPU_EMULATOR_HOST"):
        return True
    try:
        credentials()
    except TpuctlError:
        return False
    return True


def preflight() -> None:
    """Fail early, before anything is created, when an API without an emulator has no credentials."""
    if not all(os.environ.get(v) for v in ("TPU_EMULATOR_HOST", "COMPUTE_EMULATOR_HOST", "STORAGE_EMULATOR_HOST")):
        credentials()


def reset() -> None:
    """Forget cached clients (tests point the environment at new fakes)."""
    for f in (credentials, tpu, compute, storage):
        f.cache_clear()
