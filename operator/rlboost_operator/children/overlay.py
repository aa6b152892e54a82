"""A pod-template overlay (rlboost.pod_policy.PodTemplateOverlay) merged over a pod template the operator built.

The rules (strategic-merge-like; docs/kubernetes.md "Pod-template overlays"):
- metadata.labels and annotations: added (the operator's own keys are refused by the spec);
- spec.containers and spec.initContainers: matched by name, a name the pod lacks is refused; in a container, image
  and other scalar fields replace the operator's, volumeMounts are merged by mountPath (the overlay's wins),
  resources.limits / requests are merged key by key, nested objects (securityContext...) are merged;
- spec.volumes: by name, added or replacing the operator's of that name (e.g. a larger 'model' volume);
- spec.tolerations and spec.topologySpreadConstraints: appended (a toleration the pod has is not repeated);
- spec.affinity: nodeAffinity's required terms are ANDed into each of the operator's terms (a pod must satisfy the
  operator's placement and the team's), every other term (preferred, podAffinity, podAntiAffinity) is appended;
- spec.nodeSelector: merged key by key;
- any other field: an object is merged, anything else set as written.
What the operator owns (commands, its volumes and mounts, the ServiceAccount...) the spec refuses before this runs;
a mount of a volume the pod does not have is refused here (OverlayError names the field).
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any


class OverlayError(ValueError):
    """An overlay that does not fit the pod it is merged over; `field` is its path under podTemplate."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _merge_objects(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Objects merged key by key, recursively; anything else in `over` replaces what `base` has."""
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge_objects(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _by_key(base: list[dict[str, Any]], over: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """`base` with each item of `over` replacing the one of the same `key`, or appended."""
    out = list(base)
    for item in over:
        at = next((i for i, old in enumerate(out) if old.get(key) == item.get(key)), None)
        if at is None:
            out.append(item)
        else:
            out[at] = item
    return out


def _merge_container(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in over.items() if k not in ("volumeMounts", "resources")}
    out = _merge_objects(base, rest)
    if "volumeMounts" in over:
        out["volumeMounts"] = _by_key(base.get("volumeMounts", []), over["volumeMounts"], "mountPath")
    if "resources" in over:
        out["resources"] = _merge_objects(base.get("resources", {}), over["resources"])
    return out


def _merge_containers(kind: str, base: list[dict[str, Any]], over: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = list(base)
    names = [c["name"] for c in base]
    for i, item in enumerate(over):
        if item["name"] not in names:
            raise OverlayError(
                f"spec.{kind}.{i}.name",
                f"podTemplate.spec.{kind}[{i}]: the pod has no container {item['name']!r} (its {kind}: "
                f"{', '.join(names) or 'none'}); containers cannot be added",
            )
        at = names.index(item["name"])
        out[at] = _merge_container(out[at], item)
    return out


def _and_terms(base: list[dict[str, Any]], over: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Node selector terms are ORed: a pod must match one of the operator's AND one of the overlay's, so each
    operator term gets each overlay term's expressions (the cross product; one term each is the usual case)."""
    if not base:
        return over
    return [
        {
            key: [*b.get(key, []), *o.get(key, [])]
            for key in ("matchExpressions", "matchFields")
            if b.get(key) or o.get(key)
        }
        for b in base
        for o in over
    ]


def _merge_affinity(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for kind, terms in over.items():
        merged = out.setdefault(kind, {})
        for when, value in terms.items():
            if kind == "nodeAffinity" and when == "requiredDuringSchedulingIgnoredDuringExecution":
                have = merged.get(when, {}).get("nodeSelectorTerms", [])
                merged[when] = {"nodeSelectorTerms": _and_terms(have, value.get("nodeSelectorTerms", []))}
            elif isinstance(value, list):
                merged[when] = [*merged.get(when, []), *value]
            else:
                merged[when] = value
    return out


def _appended(base: list[Any], over: list[Any]) -> list[Any]:
    out = list(base)
    out += [item for i, item in enumerate(over) if item not in base and item not in over[:i]]
    return out


def _merge_pod_spec(pod: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    special = {"containers", "initContainers", "volumes", "tolerations", "topologySpreadConstraints", "affinity"}
    out = _merge_objects(pod, {k: v for k, v in over.items() if k not in special})
    for kind in ("containers", "initContainers"):
        if kind in over:
            out[kind] = _merge_containers(kind, pod.get(kind, []), over[kind])
    if "volumes" in over:
        out["volumes"] = _by_key(pod.get("volumes", []), over["volumes"], "name")
    for kind in ("tolerations", "topologySpreadConstraints"):
        if kind in over:
            out[kind] = _appended(pod.get(kind, []), over[kind])
    if "affinity" in over:
        out["affinity"] = _merge_affinity(pod.get("affinity", {}), over["affinity"])
    return out


def _check_mounts(pod: dict[str, Any], over: dict[str, Any], claims: Collection[str]) -> None:
    """Each mount the overlay adds names a volume of the pod (or one of a StatefulSet's claim templates)."""
    volumes = {v["name"] for v in pod.get("volumes", [])} | set(claims)
    for kind in ("containers", "initContainers"):
        for i, container in enumerate(over.get(kind, [])):
            for j, mount in enumerate(container.get("volumeMounts", [])):
                if mount["name"] not in volumes:
                    raise OverlayError(
                        f"spec.{kind}.{i}.volumeMounts.{j}.name",
                        f"podTemplate: container {container['name']!r} mounts volume {mount['name']!r}, which the "
                        "pod does not have; add it to podTemplate.spec.volumes",
                    )


def merge_template(template: dict[str, Any], overlay: dict[str, Any], claims: Collection[str] = ()) -> dict[str, Any]:
    """`template` (a pod template: metadata + spec) with `overlay` (PodTemplateOverlay.manifest()) merged over it;
    `template` itself is not changed. `claims`: the volume names a StatefulSet's claim templates add."""
    out = copy.deepcopy(template)
    meta = overlay.get("metadata", {})
    for kind in ("labels", "annotations"):
        if meta.get(kind):
            out.setdefault("metadata", {})[kind] = {**out["metadata"].get(kind, {}), **meta[kind]}
    if overlay.get("spec"):
        out["spec"] = _merge_pod_spec(out["spec"], copy.deepcopy(overlay["spec"]))
        _check_mounts(out["spec"], overlay["spec"], claims)
    return out
