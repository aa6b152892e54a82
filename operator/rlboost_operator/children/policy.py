"""Each component's pod policy (rlboost.pod_policy.PodPolicy; issue 29) applied to the workloads the builders made:
the ServiceAccount it runs as, env and envFrom on every container (the model fetcher's too), image pull Secrets (the
chart's, then the component's), the priority class, do-not-disrupt on the single-replica services (disruption.py),
then the podTemplate overlay (overlay.py: the pool's, then a spot variant's)."""

from __future__ import annotations

from typing import Any

from rlboost.pod_policy import PodPolicy, PodTemplateOverlay
from rlboost.spec import JobSpec
from rlboost_operator.children.disruption import DO_NOT_DISRUPT, PROTECTED
from rlboost_operator.children.naming import VARIANT_LABEL
from rlboost_operator.children.overlay import OverlayError, merge_template
from rlboost_operator.children.service_accounts import account_name, component_policies
from rlboost_operator.config import OperatorSettings

WORKLOADS = ("Deployment", "StatefulSet")


def component_key(obj: dict[str, Any]) -> str:
    """Which component's policy a workload follows: its component label, or its pool for a worker."""
    lbl = obj["metadata"]["labels"]
    component = lbl["app.kubernetes.io/component"]
    return lbl["rlboost.io/pool"] if component == "rollout-worker" else component


def _add_env(container: dict[str, Any], policy: PodPolicy) -> None:
    dump = lambda items: [i.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True) for i in items]  # noqa: E731
    if policy.env:
        added = {e["name"]: e for e in dump(policy.env)}
        kept = [e for e in container.get("env", []) if e["name"] not in added]  # the spec refuses the operator's
        container["env"] = [*kept, *added.values()]
    if policy.env_from:
        container["envFrom"] = [*container.get("envFrom", []), *dump(policy.env_from)]


def _apply(job: str, key: str, template: dict[str, Any], policy: PodPolicy, settings: OperatorSettings) -> None:
    pod = template["spec"]
    pod["serviceAccountName"] = account_name(job, key, policy)
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        _add_env(container, policy)
    pulls = [*settings.image_pull_secrets, *(ref.name for ref in policy.image_pull_secrets)]
    if pulls:
        pod["imagePullSecrets"] = [{"name": name} for name in dict.fromkeys(pulls)]
    if policy.priority_class_name:
        pod["priorityClassName"] = policy.priority_class_name
    if key in PROTECTED:
        template["metadata"]["annotations"] = {**template["metadata"].get("annotations", {}), **DO_NOT_DISRUPT}


def _overlaid(obj: dict[str, Any], template: dict[str, Any], overlay: PodTemplateOverlay, where: str) -> dict[str, Any]:
    if overlay.is_empty():
        return template
    claims = [c["metadata"]["name"] for c in obj["spec"].get("volumeClaimTemplates", [])]
    try:
        return merge_template(template, overlay.manifest(), claims)
    except OverlayError as err:
        raise OverlayError(f"{where}.podTemplate.{err.field}", f"spec.{where}.{err}") from None


SPEC_PATHS = {
    "trainer": "trainer",
    "rollout-manager": "services.manager",
    "weight-server": "services.weightServer",
    "nats": "services.nats",
    "reserved": "rollout.reserved",
    "spot": "rollout.spot",
    "env-runner": "rollout.envRunners",
}


def apply_policies(objs: list[dict[str, Any]], job: str, spec: JobSpec, settings: OperatorSettings) -> None:
    """Each workload's pod template with its component's policy applied (in place); OverlayError names the spec
    field of an overlay that does not fit its pod."""
    policies = component_policies(spec)
    for obj in objs:
        if obj["kind"] not in WORKLOADS:
            continue
        key = component_key(obj)
        policy = policies[key]
        template = obj["spec"]["template"]
        _apply(job, key, template, policy, settings)
        template = _overlaid(obj, template, policy.pod_template, SPEC_PATHS[key])
        variant = template["metadata"]["labels"].get(VARIANT_LABEL)
        if key == "spot" and variant:
            index = [v.name for v in spec.rollout.spot.variants].index(variant)
            template = _overlaid(
                obj, template, spec.rollout.spot.variants[index].pod_template, f"rollout.spot.variants.{index}"
            )
        obj["spec"]["template"] = template
