"""What the Kubernetes API server refuses of an object's metadata and names, and of a custom resource against its
CRD's schema (issue 57 item 2): the fake API server (k8s_server.py) and the fake controllers (k8s_cluster.py) run
every object they store through `problems`, so a name or label that a real cluster would refuse fails in the fake
the same way, instead of being copied along.

Modelled, with sources (kubernetes/kubernetes, staging/src/k8s.io/apimachinery):
- pkg/util/validation/validation.go: IsDNS1123Label (63, `[a-z0-9]([-a-z0-9]*[a-z0-9])?`), IsDNS1123Subdomain
  (253, labels joined by '.'), IsDNS1035Label (63, a letter first), IsQualifiedName (label and annotation keys: an
  optional DNS-1123 subdomain prefix and '/', then a name of at most 63 characters `([A-Za-z0-9][-A-Za-z0-9_.]*)?
  [A-Za-z0-9]`), IsValidLabelValue (at most 63, empty or the same pattern); their messages ("must be no more than 63
  characters", ...) are the API server's;
- pkg/api/validation/objectmeta.go: ValidateAnnotations, TotalAnnotationSizeLimitB = 256 KiB (keys and values
  together);
- object names by kind (pkg/apis/core/validation/validation.go): a Service's is a DNS-1035 label
  (ValidateServiceName), a Namespace's a DNS-1123 label, every other kind's (Pod, Node, Job, a custom resource's:
  apiextensions-apiserver's customresource_validation uses NameIsDNSSubdomain) a DNS-1123 subdomain;
- a Pod's spec.hostname and spec.subdomain are DNS-1123 labels (ValidatePodSpec);
- a custom resource against its CRD's openAPIV3Schema after pruning (schema.prune), 422 Invalid when it does not
  validate (apiextensions-apiserver: structural schema validation). Not modelled: CEL rules
  (x-kubernetes-validations), formats other than JSON Schema's own.
"""
from __future__ import annotations

import re
from typing import Any

from tpuctl.providers.gke import schema

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(rf"^{_LABEL}\Z")
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*\Z")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
TOTAL_ANNOTATION_SIZE = 256 * 1024
DNS1035_KINDS = {"Service"}
DNS1123_LABEL_KINDS = {"Namespace"}


def dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _DNS1123_LABEL.match(value):
        errs.append("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                    "start and end with an alphanumeric character")
    return errs


def dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN.match(value):
        errs.append("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                    "and must start and end with an alphanumeric character")
    return errs


def dns1035_label(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _DNS1035_LABEL.match(value):
        errs.append("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                    "alphabetic character, and end with an alphanumeric character")
    return errs


def qualified_name(key: str) -> list[str]:
    """A label's or annotation's key (IsQualifiedName)."""
    prefix, slash, name = key.rpartition("/")
    errs = []
    if slash:
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs += [f"prefix part {e}" for e in dns1123_subdomain(prefix)]
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    elif not _QUALIFIED.match(name):
        errs.append("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                    "with an alphanumeric character")
    return errs


def label_value(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if value and not _QUALIFIED.match(value):
        errs.append("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                    "and must start and end with an alphanumeric character")
    return errs


def name_problems(kind: str, name: str) -> list[str]:
    if kind in DNS1035_KINDS:
        return dns1035_label(name)
    if kind in DNS1123_LABEL_KINDS:
        return dns1123_label(name)
    return dns1123_subdomain(name)


def meta_problems(meta: dict[str, Any], path: str = "metadata") -> list[str]:
    """Labels and annotations of one ObjectMeta (an object's, or a template's)."""
    out = []
    for k, v in (meta.get("labels") or {}).items():
        out += [f"{path}.labels: Invalid value: {k!r}: {e}" for e in qualified_name(k)]
        out += [f"{path}.labels: Invalid value: {v!r}: {e}" for e in label_value(str(v))]
    notes = meta.get("annotations") or {}
    for k in notes:
        out += [f"{path}.annotations: Invalid value: {k!r}: {e}" for e in qualified_name(k)]
    if sum(len(k) + len(str(v)) for k, v in notes.items()) > TOTAL_ANNOTATION_SIZE:
        out.append(f"{path}.annotations: Too long: must have at most {TOTAL_ANNOTATION_SIZE} bytes")
    return out


def _pod_spec_problems(spec: dict[str, Any], path: str) -> list[str]:
    out = []
    for f in ("hostname", "subdomain"):
        if spec.get(f):
            out += [f"{path}.{f}: Invalid value: {spec[f]!r}: {e}" for e in dns1123_label(spec[f])]
    return out


def problems(obj: dict[str, Any], crd_schema: dict[str, Any] | None = None) -> list[str]:
    """Why the API server would refuse `obj` ([] when it would not); `crd_schema`: its CRD's openAPIV3Schema, for a
    custom resource."""
    kind, meta = str(obj.get("kind", "")), obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    out = [f"metadata.name: Invalid value: {name!r}: {e}" for e in name_problems(kind, name)] if name else \
        ["metadata.name: Required value: name or generateName is required"]
    if meta.get("namespace"):
        out += [f"metadata.namespace: Invalid value: {meta['namespace']!r}: {e}"
                for e in dns1123_label(str(meta["namespace"]))]
    out += meta_problems(meta)
    if kind == "Pod":
        out += _pod_spec_problems(obj.get("spec") or {}, "spec")
    if kind == "Job":
        tmpl = (obj.get("spec") or {}).get("template") or {}
        out += meta_problems(tmpl.get("metadata") or {}, "spec.template.metadata")
        out += _pod_spec_problems(tmpl.get("spec") or {}, "spec.template.spec")
    if crd_schema is not None:
        import jsonschema
        try:
            jsonschema.Draft7Validator(crd_schema).validate(schema.prune(obj, crd_schema))
        except jsonschema.ValidationError as e:
            where = ".".join(str(p) for p in e.absolute_path)
            out.append(f"{where or '<root>'}: Invalid value: {e.message}")
    return out


def refusal(obj: dict[str, Any], errs: list[str]) -> str:
    """The 422 message, as the API server words it: `Kind.group "name" is invalid: field: Invalid value: ...`."""
    api = str(obj.get("apiVersion", "v1"))
    group = api.split("/")[0] if "/" in api else ""
    kind = f"{obj.get('kind', '')}.{group}" if group else str(obj.get("kind", ""))
    return f"{kind} \"{(obj.get('metadata') or {}).get('name', '')}\" is invalid: " + "; ".join(errs)
