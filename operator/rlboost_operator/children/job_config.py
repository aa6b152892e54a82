"""The job file (the spec in a ConfigMap every service mounts at /etc/rlboost/job.yaml) and the config hash: a
pod template annotation digesting what the pods run, so that a change of it rolls them."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rlboost.spec import JobSpec, dump_job_spec
from rlboost_operator.children.naming import labels, names
from rlboost_operator.children.pod import meta

CONFIG_HASH = "rlboost.io/config-hash"  # pod template annotation: what the pods run; a change rolls them
# Spec fields only the operator reads: an edit of them must not roll the pods (it would cost the trainer the
# steps since its last checkpoint for nothing).
# suspend: toggling it must reach the trainer as a request to checkpoint first (suspension.py), never as a restart.
OPERATOR_ONLY_FIELDS = ("prices", "retention", "trainer.backoffLimit", "suspend", "budget")


def config_map(job: str, namespace: str, spec: JobSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(names(job)["config"], namespace, labels(job, "config")),
        "data": {"job.yaml": dump_job_spec(spec)},
    }


def _service_view(spec: JobSpec) -> dict[str, Any]:
    """The job file as the services read it: without the fields only the operator reads."""
    data = spec.model_dump(by_alias=True, mode="json")
    for path in OPERATOR_ONLY_FIELDS:
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node.pop(leaf, None)
    return data


def config_hash(spec: JobSpec, pod: dict[str, Any]) -> str:
    """A digest of what a pod runs that its template does not show: the job file it mounts (less the operator's
    own fields) and its containers' rendered commands, args, env and images."""
    run = [
        {key: c.get(key) for key in ("name", "image", "command", "args", "env")}
        for c in [*pod.get("initContainers", []), *pod["containers"]]
    ]
    text = json.dumps({"job": _service_view(spec), "containers": run}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_nats(obj: dict[str, Any]) -> bool:
    """The job's NATS runs no job file and no rlboost command: no config hash (a spec edit must not restart it)."""
    return obj["metadata"]["labels"].get("app.kubernetes.io/component") == "nats"


def annotate_config_hash(objs: list[dict[str, Any]], spec: JobSpec) -> None:
    """Each workload's pod template (the job's NATS's aside) annotated with its config hash."""
    for obj in objs:
        if obj["kind"] in ("Deployment", "StatefulSet") and not _is_nats(obj):
            template = obj["spec"]["template"]
            annotations = template["metadata"].setdefault("annotations", {})
            annotations[CONFIG_HASH] = config_hash(spec, template["spec"])
