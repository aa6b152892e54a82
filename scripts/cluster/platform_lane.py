"""A platform team's cluster in the lane (`--platform`), for examples/rljob-platform.yaml (issue 29): every node
tainted team=ml:NoSchedule (the podlet's --node-taint: a pod without the toleration stays Pending), the PriorityClass
rlboost-training (the podlet creates no pod naming a class that does not exist), and the Secrets the job names
(`tracking`, whose keys become the trainer's env; `registry-creds`, an image pull Secret, which the podlet, pulling
nothing, never reads).

While the job runs, `observe` records what each pod got: its ServiceAccount and that account's annotations, its
priority class and priority, its do-not-disrupt annotations, the WANDB_MODE its container sees (from the Secret) and
the size of its /dev/shm, both read inside the running container.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import httpx

TAINT = "team=ml:NoSchedule"
PRIORITY_CLASS = {
    "apiVersion": "scheduling.k8s.io/v1",
    "kind": "PriorityClass",
    "metadata": {"name": "rlboost-training"},
    "value": 100000,
    "preemptionPolicy": "Never",
    "description": "rlboost's single-replica services and trainer (the lane's platform run)",
}
TRACKING = {"WANDB_MODE": "offline", "WANDB_API_KEY": "lane-not-a-key"}
# Read inside each pod's container: the env from the Secret, and /dev/shm's size.
PROBE = (
    "import json, os; s = os.statvfs('/dev/shm'); "
    "print(json.dumps({'wandb_mode': os.environ.get('WANDB_MODE'), 'shm_bytes': s.f_blocks * s.f_frsize}))"
)


def _secret(name: str, items: dict[str, str], kind: str = "Opaque") -> dict[str, Any]:
    data = {key: base64.b64encode(value.encode()).decode() for key, value in items.items()}
    return {"apiVersion": "v1", "kind": "Secret", "type": kind, "metadata": {"name": name}, "data": data}


def prepare(http: httpx.Client, namespace: str) -> None:
    """The PriorityClass and the Secrets, before the RLJob (the nodes' taint is the podlet's)."""
    http.post("/apis/scheduling.k8s.io/v1/priorityclasses", json=PRIORITY_CLASS).raise_for_status()
    registry = json.dumps({"auths": {"registry.example": {"auth": base64.b64encode(b"lane:lane").decode()}}})
    for secret in (
        _secret("tracking", TRACKING),
        _secret("registry-creds", {".dockerconfigjson": registry}, "kubernetes.io/dockerconfigjson"),
    ):
        http.post(f"/api/v1/namespaces/{namespace}/secrets", json=secret).raise_for_status()


def _account_annotations(http: httpx.Client, namespace: str, account: str) -> dict[str, str] | None:
    resp = http.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}")
    return (resp.json()["metadata"].get("annotations") or {}) if resp.status_code == 200 else None


def observe(
    http: httpx.Client, namespace: str, pods: list[dict[str, Any]], exec_in: Callable[[str, list[str]], str]
) -> dict[str, dict[str, Any]]:
    """What each running pod got (see the module docstring); `exec_in(pod, argv)`: run argv in the pod's container."""
    seen = {}
    for pod in pods:
        name, spec = pod["metadata"]["name"], pod["spec"]
        account = spec.get("serviceAccountName", "default")
        inside: dict[str, Any] = {}
        try:
            inside = json.loads(exec_in(name, ["python3", "-c", PROBE]).strip().splitlines()[-1])
        except (ValueError, IndexError) as err:
            inside = {"error": str(err)}
        seen[name] = {
            "service_account": account,
            "account_annotations": _account_annotations(http, namespace, account),
            "priority_class": spec.get("priorityClassName"),
            "priority": spec.get("priority"),
            "annotations": pod["metadata"].get("annotations") or {},
            "tolerations": spec.get("tolerations") or [],
            **inside,
        }
    return seen
