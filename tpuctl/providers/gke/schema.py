"""What a Kubernetes API server keeps of an object under a CRD's structural schema: fields the schema does not
name are dropped (unless it preserves unknown fields) and so are nulls in fields not marked nullable (Kubernetes
docs, "Extend the Kubernetes API with CustomResourceDefinitions": "Field pruning", "Defaulting and Nullable").
A field tpuctl writes that an installed JobSet's schema lacks would vanish without an error (xpk#443): this is how
tpuctl sees it first."""
from __future__ import annotations

from typing import Any


def prune(obj: Any, schema: dict[str, Any]) -> Any:
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return obj
    if isinstance(obj, dict):
        props = schema.get("properties")
        if props is not None:
            return {k: prune(v, props[k]) for k, v in obj.items()
                    if k in props and not (v is None and not props[k].get("nullable"))}
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return {k: prune(v, extra) for k, v in obj.items() if not (v is None and not extra.get("nullable"))}
        return obj
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"]) for v in obj]
    return obj


def dropped(obj: Any, schema: dict[str, Any]) -> list[str]:
    """The paths of `obj` the API server would not keep ("" when it keeps everything)."""
    return _diff(obj, prune(obj, schema), "")


def _diff(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a for d in (_diff(a[k], b[k], f"{path}.{k}") if k in b else [f"{path}.{k}"])]
    if isinstance(a, list) and isinstance(b, list):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def version_schema(crd: dict[str, Any], version: str) -> dict[str, Any] | None:
    """The openAPIV3Schema of `version` in a CustomResourceDefinition, None when it does not serve it."""
    for v in crd.get("spec", {}).get("versions", []):
        if v.get("name") == version and v.get("served", True):
            found: dict[str, Any] | None = v.get("schema", {}).get("openAPIV3Schema")
            return found
    return None
