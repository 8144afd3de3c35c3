"""The ONLY place endpoints and credentials are applied (GCP_FACTS §3).

TPU_EMULATOR_HOST=host:port          plaintext gRPC for tpu_v1 and tpu_v2
COMPUTE_EMULATOR_HOST=http://host:port   Compute REST
STORAGE_EMULATOR_HOST=http://host:port   honoured by google-cloud-storage itself
CONTAINER_EMULATOR_HOST=http://host:port GKE (google-cloud-container), REST
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
def container() -> Any:
    """GKE's ClusterManagerClient over REST, real or emulated alike, so the fake (tests/fakes/gke_server.py) sees
    the wire the real service does. The generated REST transport keeps an `http://` scheme given in api_endpoint
    (google-cloud-container, cluster_manager/transports/rest_base.py: `maybe_url_match`)."""
    from google.cloud import container_v1
    host = os.environ.get("CONTAINER_EMULATOR_HOST")
    if host:
        return container_v1.ClusterManagerClient(credentials=_anonymous(), transport="rest",
                                                 client_options={"api_endpoint": host})
    return container_v1.ClusterManagerClient(credentials=credentials(), transport="rest")


@functools.lru_cache(maxsize=None)
def storage(project: str | None) -> Any:
    import google.cloud.storage as gcs
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return gcs.Client(project=project, credentials=_anonymous())
    return gcs.Client(project=project, credentials=credentials())


def access_token() -> str:
    """A bearer token for a GKE cluster's Kubernetes API: the user's Google credentials, refreshed (GKE accepts
    Google OAuth2 access tokens: kubernetes-engine/docs/how-to/api-server-authentication); "" under the GKE
    emulator, whose fake Kubernetes API takes anonymous requests."""
    if os.environ.get("CONTAINER_EMULATOR_HOST"):
        return ""
    from google.auth.transport.requests import Request
    creds = credentials()
    if not creds.valid:
        creds.refresh(Request())
    return str(creds.token)


def has_credentials() -> bool:
    """Whether the TPU API can be asked now (an emulator, or Application Default Credentials)."""
    if os.environ.get("TPU_EMULATOR_HOST"):
        return True
    try:
        credentials()
    except TpuctlError:
        return False
    return True


TPU_APIS = ("TPU_EMULATOR_HOST", "COMPUTE_EMULATOR_HOST", "STORAGE_EMULATOR_HOST")
GKE_APIS = ("CONTAINER_EMULATOR_HOST", "COMPUTE_EMULATOR_HOST", "STORAGE_EMULATOR_HOST")


def preflight(apis: tuple[str, ...] = TPU_APIS) -> None:
    """Fail early, before anything is created, when an API without an emulator has no credentials."""
    if not all(os.environ.get(v) for v in apis):
        credentials()


def reset() -> None:
    """Forget cached clients (tests point the environment at new fakes)."""
    for f in (credentials, tpu, compute, storage, container):
        f.cache_clear()
