"""The Kubernetes API through the official `kubernetes` client, imported here only (lazily: `tpuctl --help` never
loads it). A cluster is reached with GKE's endpoint and CA and a Google token (no kubeconfig or gcloud needed), or
through a kubeconfig context where the user has one.

Requests go through ApiClient.param_serialize/call_api, the path kubernetes' own DynamicClient takes
(kubernetes/dynamic/client.py `request`), so one code path serves every kind (JobSets, the JobSet release's objects)
without the DynamicClient's discovery round trips."""
from __future__ import annotations

import base64
import json
import os
from typing import Any, Callable

from ...core.errors import ErrorKind, TpuctlError

FIELD_MANAGER = "tpuctl"
APPLY = "application/apply-patch+yaml"   # server-side apply (Kubernetes docs, "Server-Side Apply")


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def connect(endpoint: str, ca_b64: str, token: str) -> Any:
    """An ApiClient for GKE's `endpoint` (masterAuth.clusterCaCertificate is base64 PEM) with a bearer token. An
    endpoint with a scheme is used as given (the fake API server is plain http)."""
    from kubernetes import client
    cfg = client.Configuration()
    cfg.host = endpoint if "://" in endpoint else f"https://{endpoint}"
    if ca_b64:   # in memory (kubernetes Configuration.ca_cert_data): no temp file per connection, none left
        cfg.ca_cert_data = base64.b64decode(ca_b64).decode()
    if token:
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(cfg)


def connect_context(name: str) -> Any:
    """An ApiClient for the kubeconfig context `name` (KUBECONFIG or ~/.kube/config)."""
    from kubernetes import config
    try:   # KUBECONFIG read now: the client's own default is read once, when kubernetes.config is first imported
        return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG") or None, context=name)
    except (config.ConfigException, OSError) as e:
        raise TpuctlError(ErrorKind.INPUT, f"kubeconfig context {name!r}: {e}",
                          "`kubectl config get-contexts` lists them") from None


def check_context(name: str) -> None:
    """`up --kube-context NAME`, checked offline before anything is made: the context is in the user's kubeconfig."""
    from kubernetes import config
    hint = "`kubectl config get-contexts` lists them; leave --kube-context out to use GKE's endpoint"
    try:
        contexts, _ = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG") or None)
    except (config.ConfigException, OSError) as e:
        raise TpuctlError(ErrorKind.INPUT, f"--kube-context {name!r}: no kubeconfig to read it from ({e})",
                          hint) from None
    if name not in {c.get("name") for c in contexts or []}:
        raise TpuctlError(ErrorKind.INPUT, f"--kube-context {name!r} is not in your kubeconfig", hint)


_CLIENTS: dict[tuple[str, str], Any] = {}   # (endpoint, CA) -> its ApiClient, one per process


def for_record(rec: dict[str, Any], token: Callable[[], str]) -> Any:
    """An ApiClient for the cluster a `gke` record names: through the kubeconfig context `up --kube-context` saved,
    else GKE's endpoint and CA with a Google token (`token()`, asked for only then). One client per cluster and
    process (its connection pool kept across the 5-second polls), whose token is asked for again before each
    request through the client's own hook (kubernetes Configuration.refresh_api_key_hook, called by
    get_api_key_with_prefix), so an hour-long `logs -f` outlives the token it started with."""
    if rec.get("context"):
        return connect_context(str(rec["context"]))
    key = (str(rec["endpoint"]), str(rec.get("ca_certificate") or ""))
    api = _CLIENTS.get(key)
    if api is None:
        api = _CLIENTS[key] = connect(key[0], key[1], token())

        def refresh(cfg: Any) -> None:
            fresh = token()
            if fresh:
                cfg.api_key = {"BearerToken": fresh}
                cfg.api_key_prefix = {"BearerToken": "Bearer"}
        api.configuration.refresh_api_key_hook = refresh
    return api


def request(api: Any, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
            content_type: str = "application/json") -> Any:
    """One call; the decoded JSON answer (None for an empty one). KubeError carries a refusal's Status."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError
    serialized = api.param_serialize(method, path, query_params=query or [],
                                     header_params={"Content-Type": content_type, "Accept": "application/json"},
                                     body=body, auth_settings=["BearerToken"])
    try:
        resp = api.call_api(*serialized)
        resp.read()
    except ApiException as e:   # raised for the status codes the client maps (404, 409, ...)
        raise _error(e.status or 0, e.body) from None
    except HTTPError as e:   # no answer at all (connection refused, TLS), after the client's own retries
        raise TpuctlError(ErrorKind.ERROR, f"the cluster's Kubernetes API at {api.configuration.host} did not "
                          f"answer: {type(e).__name__}", "check the cluster is RUNNING (`tpuctl status`) and "
                          "reachable from this machine") from None
    if not 200 <= resp.status <= 299:
        raise _error(resp.status, resp.data)
    if not resp.data:
        return None
    try:
        return json.loads(resp.data)
    except ValueError:   # pods/log answers text/plain
        return resp.data.decode("utf-8", "replace")


def _error(status: int, data: Any) -> KubeError:
    try:   # a metav1.Status: {"kind": "Status", "reason": "NotFound", "message": "..."}
        st = json.loads(data or b"{}")
    except ValueError:
        st = {}
    return KubeError(status, str(st.get("reason", "")), str(st.get("message", data)))


def get(api: Any, path: str, query: list[tuple[str, str]] | None = None) -> dict[str, Any] | None:
    """The object (or list) at `path`, None when it is not there (a custom resource whose CRD is not installed
    answers 404 too)."""
    try:
        found: dict[str, Any] = request(api, "GET", path, query=query)
        return found
    except KubeError as e:
        if e.status == 404:
            return None
        raise


def apply(api: Any, path: str, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    """Server-side apply of `obj` at its own path, taking over conflicting fields (`kubectl apply --server-side
    --force-conflicts`, as xpk installs JobSet: core/cluster.py). `dry_run`: through admission and validation,
    nothing stored (`dryRun=All`: Kubernetes docs, "API Concepts: Dry-run")."""
    query = [("fieldManager", FIELD_MANAGER), ("force", "true")] + ([("dryRun", "All")] if dry_run else [])
    done: dict[str, Any] = request(api, "PATCH", path, obj, query, APPLY)
    return done


def delete(api: Any, path: str, propagation: str = "Foreground") -> bool:
    """Delete; False when already gone. Foreground: the JobSet's Jobs and pods go first (Kubernetes docs,
    "Garbage Collection")."""
    try:
        request(api, "DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation})
        return True
    except KubeError as e:
        if e.status == 404:
            return False
        raise


def object_path(obj: dict[str, Any], plural: str, namespaced: bool) -> str:
    """REST path of an object: /api/v1/... for the core group, /apis/GROUP/VERSION/... otherwise."""
    group_version = obj["apiVersion"]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    ns = f"/namespaces/{obj['metadata']['namespace']}" if namespaced else ""
    return f"{base}{ns}/{plural}/{obj['metadata']['name']}"
