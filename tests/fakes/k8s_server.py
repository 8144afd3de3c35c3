"""A small HTTP fake of the Kubernetes API server: what tpuctl's GKE provider calls through the official
`kubernetes` client (providers/gke/kube.py). Plain http on an ephemeral port, one instance per test.

Modelled, with sources:
- objects stored by REST path: /api/v1/... (core group) and /apis/GROUP/VERSION/... (Kubernetes docs, "API
  Concepts": resource URIs); GET of a missing object answers 404 with a metav1.Status, reason NotFound;
- server-side apply: PATCH with Content-Type application/apply-patch+yaml creates the object when absent and
  otherwise sets the fields the applier gives (Kubernetes docs, "Server-Side Apply"); the request needs
  `fieldManager` (the API server answers 400 "PATCH requests with apply content type must have a field manager",
  staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go); any other PATCH content type is refused here,
  but a node's strategic merge patch (`kubectl cordon`'s: spec.unschedulable, which a sick GKE pod's agent sends:
  host/cordon.py);
- a custom resource is served only once its CustomResourceDefinition exists: without the JobSet CRD,
  /apis/jobset.x-k8s.io/... answers 404 (the group/version is not registered);
- every object applied is validated as the API server validates it (k8s_validation.py: its name by kind, label
  keys and values, annotation size; a custom resource against its CRD's openAPIV3Schema after pruning), 422
  Invalid when it does not validate; so are the objects the fake controllers make (FakeKube.create: a Job the
  JobSet controller derives, a pod the Job controller derives), which fail as a real controller's create fails;
- JobSet v0.10.1's validating webhook (pkg/webhooks/jobset_webhook.go ValidateCreate): the longest Job name and
  the longest pod name it derives (`<jobset>-<rjob>-<maxJobIndex>-<maxPodIndex>-abcde`) must be DNS-1035 labels;
  it does NOT check the coordinator label (that came in v0.11, commit a9461e60);
- list with `labelSelector=k=v[,k=v]` (equality selectors only: all tpuctl sends);
- DELETE answers the Status; with propagationPolicy Foreground or Background the owned objects (ownerReferences)
  go too (Kubernetes docs, "Garbage Collection"); the kubelet is told, to stop the pods' processes;
- pods/log: the container's output as text (`GET .../pods/NAME/log`, `tailLines` honoured); 400 while the pod has
  not started ("container ... is waiting to start", what the API server relays from the kubelet);
- status subresources are written only by the fake controllers (cluster.py), as by real controllers;
- JobSet's release, as it comes up (issue 49 item 2): its CRD is `Established` once applied (apiextensions
  CustomResourceDefinition status conditions NamesAccepted, Established); its controller Deployment is `Available`
  only `controller_delay` seconds after it is applied, because its readiness probe waits for the webhook
  certificates (jobset v0.10.1 main.go `setupHealthzAndReadyzCheck(mgr, certsReady)`; the certs come from the
  controller's own rotator, pkg/util/cert/cert.go). Until then, with the release's
  MutatingWebhookConfiguration present, a JobSet create is refused as the API server refuses a call to a webhook
  with `failurePolicy: Fail` that has no endpoint: 500 InternalError, 'Internal error occurred: failed calling
  webhook "mjobset.kb.io": ... no endpoints available for service "jobset-webhook-service"' (the release's
  mjobset.kb.io webhook, failurePolicy Fail; Kubernetes docs "Dynamic Admission Control": failurePolicy);
- `dryRun=All` (Kubernetes docs, "API Concepts: Dry-run"): the request goes through admission and validation and
  answers as if done, storing nothing.
Not modelled: authentication (any bearer token), watches, resourceVersion conflicts.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

import yaml

from tpuctl.providers.gke import schema
from fakes import k8s_validation
from fakes.wire import QuietHandler, serve

JOBSET_CRD = "jobsets.jobset.x-k8s.io"
KUEUE_CRD = "workloads.kueue.x-k8s.io"
CRD_PREFIX = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
CONTROLLER = "/apis/apps/v1/namespaces/jobset-system/deployments/jobset-controller-manager"
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/jobset-mutating-webhook-configuration"
# Kueue's release the same way (its kueue-mutating-webhook-configuration's webhooks are failurePolicy fail too, and
# its manager serves them once its own cert rotator is ready: kueue v0.17.8 config/components/webhook,
# cmd/kueue/main.go): for the objects of the kueue.x-k8s.io group
KUEUE_CONTROLLER = "/apis/apps/v1/namespaces/kueue-system/deployments/kueue-controller-manager"
KUEUE_MUTATING = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                  "kueue-mutating-webhook-configuration")
NODE_PATCH = "application/strategic-merge-patch+json"   # types.StrategicMergePatchType: what kubectl cordon sends
WEBHOOK_DOWN = ('Internal error occurred: failed calling webhook "mjobset.kb.io": failed to call webhook: Post '
                '"https://jobset-webhook-service.jobset-system.svc:443/mutate-jobset-x-k8s-io-v1alpha2-jobset?'
                'timeout=10s": no endpoints available for service "jobset-webhook-service"')


# Namespaces every cluster has from the start (Kubernetes docs, "Namespaces: Initial namespaces"): served without
# being stored, so tests that look at what tpuctl made see only that.
BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def namespace_of(path: str) -> str:
    """The namespace of a namespaced object's path (/api/v1/namespaces/NS/PLURAL/NAME, /apis/G/V/namespaces/NS/...);
    "" for a cluster-scoped one, a Namespace itself included."""
    parts = path.strip("/").split("/")
    i = 2 if parts[0] == "api" else 3
    return parts[i + 1] if len(parts) > i + 2 and parts[i] == "namespaces" else ""


def write_kubeconfig(path: Any, server: str) -> None:
    """A kubeconfig whose one context, `mine` (the current one), reaches `server` with a static token: how a user
    points tpuctl at a cluster with `up --kube-context` (kubernetes' config/kube_config.py reads these fields)."""
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t0k}}}}]
contexts: [{{name: mine, context: {{cluster: c, user: u}}}}]
current-context: mine
""")


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class Invalid(Exception):
    """What the API server answers 422 for (k8s_validation.refusal's message)."""


# The resource a kind's create is admitted as (webhook rules name resources), and each release's webhook Service's
# controller (the Deployment whose pods serve it: jobset and kueue config/components/webhook, manager)
_PLURAL = {"Pod": "pods", "Job": "jobs", "Deployment": "deployments", "StatefulSet": "statefulsets"}
_CONTROLLERS = {"jobset-webhook-service": CONTROLLER, "kueue-webhook-service": KUEUE_CONTROLLER}


def crd_name(path: str) -> tuple[str, str] | None:
    """(CRD name, version) of a custom resource's path /apis/G/V/[namespaces/NS/]PLURAL/NAME; None for a built-in
    group's (no '.' in it, or *.k8s.io, which are Kubernetes' own)."""
    parts = path.strip("/").split("/")
    if parts[0] != "apis" or len(parts) < 5 or "." not in parts[1] or parts[1].endswith("k8s.io") \
            and not parts[1].endswith("x-k8s.io"):
        return None
    rest = parts[3:]
    if rest[0] == "namespaces":
        rest = rest[2:]
    return (f"{rest[0]}.{parts[1]}", parts[2]) if rest else None


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.lock = threading.RLock()
        self.logs: dict[str, bytes] = {}                 # pod path -> its container's output so far
        self.requests: list[tuple[str, str]] = []       # (method, path) as received
        self.on_delete: list[Callable[[str, dict[str, Any]], None]] = []
        # (method, path prefix, status[, message]): the next such call fails
        self.faults: list[tuple[Any, ...]] = []
        self.controller_delay = 0.5     # seconds from the JobSet controller's apply to its webhooks serving
        self.due: list[tuple[float, Callable[[], None]]] = []   # (monotonic time, what then happens)
        handler = type("H", (_Handler,), {"kube": self})
        self.server = serve(handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what the handler and the fake controllers use -----------------------------------------------------
    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            meta = obj.setdefault("metadata", {})
            old = self.objects.get(path)
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            self.objects[path] = obj
            return obj

    def crd_schema(self, path: str) -> dict[str, Any] | None:
        """The openAPIV3Schema of the CRD a custom resource's path belongs to, None when none is known (a built-in
        kind, or a CRD stored without its schema)."""
        found = crd_name(path)
        crd = self.objects.get(CRD_PREFIX + found[0]) if found else None
        return schema.version_schema(crd, found[1]) if crd and found else None

    def check(self, path: str, obj: dict[str, Any]) -> None:
        """Raises Invalid with the API server's message when it would refuse `obj` at `path`."""
        errs = k8s_validation.problems(obj, self.crd_schema(path))
        if errs:
            raise Invalid(k8s_validation.refusal(obj, errs))

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """What a controller's create does: through the admission webhooks that cover it, validated (Invalid when
        the API server would refuse it), then stored."""
        meta = obj["metadata"]
        down = self.webhook_refusal(_PLURAL.get(str(obj.get("kind")), ""), str(meta.get("namespace", "")),
                                    meta.get("labels") or {})
        if down:
            raise Invalid(down)
        self.check(path, obj)
        return self.put(path, obj)

    def webhook_refusal(self, resource: str, namespace: str, labels: dict[str, str]) -> str:
        """The API server's refusal of a CREATE of `resource` in `namespace` when a registered webhook with
        `failurePolicy: Fail` covers it (its rules' resources, its namespaceSelector's NotIn list, its
        objectSelector's Exists keys: JobSet's pod webhooks select pods labelled jobset-name) and its service's
        controller is not Available (Kubernetes docs "Dynamic Admission Control": failurePolicy Fail "means that an
        error calling the webhook causes the admission to fail"); "" when none does. Kueue's release registers such
        webhooks on pods, deployments, statefulsets and jobs in every namespace but kube-system and kueue-system."""
        configs = [o for p, o in list(self.objects.items()) if p.startswith(
            ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/",
             "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"))]
        for config in configs:
            for hook in config.get("webhooks", []):
                service = hook.get("clientConfig", {}).get("service", {})
                controller = _CONTROLLERS.get(str(service.get("name")))
                if hook.get("failurePolicy", "Fail") != "Fail" or controller is None or \
                        not any(resource in r.get("resources", []) and "CREATE" in r.get("operations", [])
                                for r in hook.get("rules", [])):
                    continue
                skip = [v for e in hook.get("namespaceSelector", {}).get("matchExpressions", [])
                        if e.get("key") == "kubernetes.io/metadata.name" and e.get("operator") == "NotIn"
                        for v in e.get("values", [])]
                needs = [e["key"] for e in hook.get("objectSelector", {}).get("matchExpressions", [])
                         if e.get("operator") == "Exists"]
                if namespace in skip or not all(k in labels for k in needs) or self.serving(controller):
                    continue
                return (f'Internal error occurred: failed calling webhook "{hook["name"]}": failed to call webhook: '
                        f'no endpoints available for service "{service.get("name")}"')
        return ""

    def list(self, prefix: str, selector: dict[str, str] | None = None) -> list[dict[str, Any]]:
        with self.lock:
            found = [o for p, o in self.objects.items() if p.startswith(prefix) and p[len(prefix):].count("/") == 0]
        return [o for o in found if all(o["metadata"].get("labels", {}).get(k) == v
                                        for k, v in (selector or {}).items())]

    def remove(self, path: str) -> dict[str, Any] | None:
        with self.lock:
            gone = self.objects.get(path)
            if gone is None:
                return None
            if gone.get("kind") == "Namespace":
                # the namespace controller deletes every object in a deleted namespace, then the namespace
                # (Kubernetes docs, "Namespaces": "Deleting a namespace ... deletes everything under the namespace")
                inside = [p for p in self.objects if namespace_of(p) == gone["metadata"]["name"]]
            else:
                inside = []
            if "/pods/" in path and gone.get("status", {}).get("phase") == "Running" and self.on_delete:
                # a running pod is Terminating (deletionTimestamp set) until its container has stopped; the
                # kubelet removes it then (Kubernetes docs, "Pod Lifecycle: Termination of Pods")
                gone["metadata"].setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
            else:
                del self.objects[path]
            uid = gone["metadata"]["uid"]
            owned = [p for p, o in self.objects.items()
                     if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", []))]
        for fn in self.on_delete:
            fn(path, gone)
        for p in owned + inside:
            self.remove(p)
        return gone

    def later(self, delay: float, fn: Callable[[], None]) -> None:
        with self.lock:
            self.due.append((time.monotonic() + delay, fn))

    def catch_up(self) -> None:
        """What was due by now (a controller becoming ready) happens before the next request is answered."""
        with self.lock:
            now = time.monotonic()
            due, self.due = [f for t, f in self.due if t <= now], [(t, f) for t, f in self.due if t > now]
            for fn in due:
                fn()

    def serving(self, controller: str) -> bool:
        """The controller's Deployment is Available (its pods serve the webhooks)."""
        dep = self.objects.get(controller)
        return dep is not None and any(c.get("type") == "Available" and c.get("status") == "True"
                                       for c in dep.get("status", {}).get("conditions", []))

    def webhook_down(self, controller: str = CONTROLLER, mutating: str = MUTATING) -> bool:
        """JobSet's (or Kueue's) webhooks are registered (failurePolicy Fail) and its controller does not serve them
        yet."""
        return mutating in self.objects and not self.serving(controller)

    def applied(self, path: str, obj: dict[str, Any]) -> None:
        """The status the API server (a CRD) or the JobSet controller (its Deployment) gives what was applied."""
        if path.startswith(CRD_PREFIX):
            obj["status"] = {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                            {"type": "Established", "status": "True"}]}
        elif path in (CONTROLLER, KUEUE_CONTROLLER) and "status" not in obj:
            obj["status"] = {"conditions": [{"type": "Available", "status": "False",
                                             "reason": "MinimumReplicasUnavailable"}]}

            def ready() -> None:
                if path in self.objects:
                    self.objects[path]["status"] = {
                        "readyReplicas": 1, "availableReplicas": 1,
                        "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}]}
            self.later(self.controller_delay, ready)

    def served(self, path: str) -> bool:
        """A custom resource's path is served only once its CRD exists."""
        if path.startswith("/apis/kueue.x-k8s.io/"):
            return CRD_PREFIX + KUEUE_CRD in self.objects
        if not path.startswith("/apis/jobset.x-k8s.io/"):
            return True
        return CRD_PREFIX + JOBSET_CRD in self.objects


class _Handler(QuietHandler):
    kube: FakeKube

    def _send(self, code: int, doc: Any, text: bool = False) -> None:
        data = doc if text else json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start(self, method: str) -> tuple[str, dict[str, list[str]]] | None:
        u = urlparse(self.path)
        self.kube.requests.append((method, u.path))
        self.kube.catch_up()
        for i, (m, prefix, code, *said) in enumerate(self.kube.faults):
            if m == method and u.path.startswith(prefix):
                del self.kube.faults[i]
                self._send(code, status(code, "InternalError" if code >= 500 else "Forbidden",
                                        said[0] if said else "injected fault"))
                return None
        if not self.kube.served(u.path):
            self._send(404, status(404, "NotFound", "the server could not find the requested resource"))
            return None
        return u.path, parse_qs(u.query)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        try:   # the clients send JSON (kubernetes' ApiClient, kubectl apply's server-side patches)
            return json.loads(raw)
        except ValueError:   # JSON is YAML: an apply body may be either (libyaml's parser where PyYAML has it)
            return yaml.load(raw, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))

    def do_GET(self) -> None:
        got = self._start("GET")
        if got is None:
            return
        path, q = got
        if path.endswith("/log"):
            return self._log(path[:-len("/log")], q)
        obj = self.kube.objects.get(path)
        if obj is not None:
            return self._send(200, obj)
        if path.startswith("/api/v1/namespaces/") and path.count("/") == 4 and \
                path.rsplit("/", 1)[1] in BUILTIN_NAMESPACES:
            name = path.rsplit("/", 1)[1]
            return self._send(200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name},
                                    "status": {"phase": "Active"}})
        items = self.kube.list(path + "/", _selector(q)) or self._across_namespaces(path, _selector(q))
        if items or _is_collection(path):
            return self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items})
        self._send(404, status(404, "NotFound", f'"{path.rsplit("/", 1)[-1]}" not found'))

    def _across_namespaces(self, path: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        """/apis/G/V/PLURAL (or /api/v1/PLURAL) of a namespaced kind: every namespace's objects (Kubernetes docs,
        "API Concepts": "GET /apis/GROUP/VERSION/RESOURCETYPE - return the collection of all instances of the
        resource type across all namespaces")."""
        parts = path.strip("/").split("/")
        if len(parts) != (3 if parts[0] == "api" else 4):
            return []
        base, plural = "/" + "/".join(parts[:-1]) + "/namespaces/", parts[-1]
        with self.kube.lock:
            found = [o for p, o in self.kube.objects.items() if p.startswith(base)
                     and p[len(base):].count("/") == 2 and p[len(base):].split("/")[1] == plural]
        return [o for o in found if all(o["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())]

    def _log(self, pod_path: str, q: dict[str, list[str]]) -> None:
        pod = self.kube.objects.get(pod_path)
        if pod is None:
            return self._send(404, status(404, "NotFound", f'pods "{pod_path.rsplit("/", 1)[-1]}" not found'))
        if pod.get("status", {}).get("phase", "Pending") == "Pending":
            name = pod["spec"]["containers"][0]["name"]
            return self._send(400, status(400, "BadRequest", f'container "{name}" in pod '
                                          f'"{pod["metadata"]["name"]}" is waiting to start: ContainerCreating'))
        data = self.kube.logs.get(pod_path, b"")
        if "tailLines" in q:
            data = b"".join(data.splitlines(keepends=True)[-int(q["tailLines"][0]):])
        self._send(200, data, text=True)

    def do_PATCH(self) -> None:
        got = self._start("PATCH")
        if got is None:
            return
        path, q = got
        if self.headers.get("Content-Type") == NODE_PATCH and path.startswith("/api/v1/nodes/"):
            return self._patch_node(path)
        if self.headers.get("Content-Type") != "application/apply-patch+yaml":
            return self._send(415, status(415, "UnsupportedMediaType", "the fake serves server-side apply only"))
        if not q.get("fieldManager"):
            return self._send(400, status(400, "BadRequest",
                                          "PATCH requests with apply content type must have a field manager"))
        obj = self._body()
        ns = namespace_of(path)
        if ns and ns not in BUILTIN_NAMESPACES and f"/api/v1/namespaces/{ns}" not in self.kube.objects:
            # the NamespaceLifecycle admission plugin, on by default, "ensures that requests in a non-existent
            # Namespace are rejected" (Kubernetes docs, "Admission Control in Kubernetes"); its answer is the
            # namespace Get's NotFound ("refuse to operate on non-existent namespaces": kubernetes/kubernetes
            # staging/src/k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go, Admit)
            return self._send(404, status(404, "NotFound", f'namespaces "{ns}" not found'))
        if path.startswith("/apis/kueue.x-k8s.io/") and self.kube.webhook_down(KUEUE_CONTROLLER, KUEUE_MUTATING):
            return self._send(500, status(500, "InternalError", WEBHOOK_DOWN.replace("mjobset", "mresourceflavor")
                                          .replace("jobset-", "kueue-").replace("jobset", "kueue")))
        if path.startswith("/apis/jobset.x-k8s.io/"):
            if self.kube.webhook_down():   # admission runs before validation (the mutating webhook first)
                return self._send(500, status(500, "InternalError", WEBHOOK_DOWN))
            if path not in self.kube.objects and self.kube.served("/apis/kueue.x-k8s.io/") and \
                    obj["metadata"].get("labels", {}).get("kueue.x-k8s.io/queue-name"):
                # Kueue's JobSet webhook suspends a queued JobSet on creation (fakes/kueue.py)
                obj["spec"]["suspend"] = True
        try:   # mutating admission, then schema validation, then validating admission (Kubernetes docs, "Dynamic
            self.kube.check(path, obj)   # Admission Control")
        except Invalid as e:
            return self._send(422, status(422, "Invalid", str(e)))
        problem = _jobset_webhook(obj) if path.startswith("/apis/jobset.x-k8s.io/") else ""
        if problem:
            return self._send(422, status(422, "Invalid", problem))
        old = self.kube.objects.get(path)
        if old is not None:   # the applier's fields win; what others set (status) stays
            merged = dict(old)
            merged.update({k: v for k, v in obj.items() if k != "status"})
            obj = merged
        if q.get("dryRun") == ["All"]:
            return self._send(200 if old else 201, obj)
        self.kube.applied(path, obj)
        self._send(200 if old else 201, self.kube.put(path, obj))

    def _patch_node(self, path: str) -> None:
        """`kubectl cordon`'s call (kubectl pkg/drain/cordon.go: a strategic merge patch of the node, PATCH
        /api/v1/nodes/NODE): the patch's maps merged into the node's, its scalars replacing the node's (Kubernetes
        docs, "Update API Objects in Place Using kubectl patch": strategic merge patch; a node's spec and
        annotations hold no list the cordon touches). The scheduler then passes the node over (k8s_cluster.py)."""
        node = self.kube.objects.get(path)
        if node is None:
            return self._send(404, status(404, "NotFound", f'nodes "{path.rsplit("/", 1)[-1]}" not found'))
        patch = self._body() or {}
        with self.kube.lock:
            _merge(node, {k: v for k, v in patch.items() if k != "status"})
        self._send(200, node)

    def do_DELETE(self) -> None:
        got = self._start("DELETE")
        if got is None:
            return
        path, _ = got
        gone = self.kube.remove(path)
        if gone is None:
            return self._send(404, status(404, "NotFound", f'"{path.rsplit("/", 1)[-1]}" not found'))
        self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                         "details": {"name": gone["metadata"]["name"], "uid": gone["metadata"]["uid"]}})


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)   # a null in a merge patch deletes the field
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _jobset_webhook(js: dict[str, Any]) -> str:
    """JobSet v0.10.1's ValidateCreate on names (pkg/webhooks/jobset_webhook.go, lines 221-243): the longest Job name
    (placement.GenJobName: `<jobset>-<rjob>-<maxJobIndex>`) and, for an Indexed Job with completions, the longest pod
    name (GenPodName `<job>-<maxPodIndex>` + "-abcde") must be DNS-1035 labels."""
    name = str(js.get("metadata", {}).get("name", ""))
    errs = []
    for rj in js.get("spec", {}).get("replicatedJobs", []):
        job = f"{name}-{rj.get('name')}-{int(rj.get('replicas', 1)) - 1}"
        errs += [f"spec.replicatedJobs.name: Invalid value: {job!r}: {e}" for e in k8s_validation.dns1035_label(job)]
        spec = rj.get("template", {}).get("spec", {})
        if spec.get("completionMode") == "Indexed" and spec.get("completions") is not None:
            pod = f"{job}-{int(spec['completions']) - 1}-abcde"
            errs += [f"spec.replicatedJobs.name: Invalid value: {pod!r}: {e}"
                     for e in k8s_validation.dns1035_label(pod)]
    return f'admission webhook "vjobset.kb.io" denied the request: {"; ".join(errs)}' if errs else ""


def _selector(q: dict[str, list[str]]) -> dict[str, str]:
    raw = q.get("labelSelector", [""])[0]
    return dict(part.split("=", 1) for part in raw.split(",") if "=" in part)


def _is_collection(path: str) -> bool:
    """/api/v1/nodes, /api/v1/namespaces/NS/pods, /apis/G/V/namespaces/NS/jobsets: an even number of segments after
    the group/version names a collection."""
    parts = path.strip("/").split("/")
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    return len(rest) % 2 == 1
