"""Pure builders of an RLJob's children: plain Kubernetes manifests (dicts), no API calls. One module per kind:

- `build.py`: `build_children(job, namespace, spec, settings, spot_replicas)`, every child but the two Secrets made
  once and never rewritten, in creation order (Services first), config-hashed, an ended job's at zero replicas;
- `trainer.py`, `manager.py`, `weight_server.py`, `worker.py` (reserved and spot pools, spot variants),
  `env_runner.py` (the env-runners of a job with task.environment), `nats.py`
  (the job's own NATS and its `<job>-nats-config` Secret), `network_policy.py`, `service_accounts.py` (a worker's
  identity), `job_config.py` (the job file ConfigMap and the config hash), `job_labels.py` (the RLJob's labels on
  every child), `secrets.py` (the credentials Secret), `model.py` (the model's volume and the `fetch-model` init
  container);
- `pod.py`: what every job pod shares; `naming.py`: names, labels, ports and paths;
- `policy.py`: each component's pod policy (spec serviceAccount, env, envFrom, imagePullSecrets, priorityClassName,
  podTemplate) applied to its workload, `overlay.py` the overlay's merge rules, `disruption.py` the
  PodDisruptionBudgets and do-not-disrupt annotations of the single-replica services (issue 29).

Each job has its own NATS (TLS with the job CA, one user per role with rights on that job's subjects only) and,
unless the operator's settings say otherwise, a NetworkPolicy letting only the job's own pods in (the operator to
NATS, the monitoring namespace to metrics). Job pods run with a read-only root filesystem (an emptyDir at /tmp,
which is $HOME, for what they write), no service-account token, each component under its own ServiceAccount
(service_accounts.py), and CPU and memory requests from the spec. Each
container's command is rendered from its service's options model in `rlboost.options`, for a `Site` whose sockets
bind 0.0.0.0 (probes and Prometheus reach the pod's IP); the job spec travels in a ConfigMap mounted at
/etc/rlboost/job.yaml, every token in the credentials Secret (items of rlboost.auth.credentials; each role's pods
mount only its ROLE_ITEMS at /etc/rlboost/credentials).

This package re-exports what the handlers and the tests use, so `children.<name>` reads as before.
"""

from rlboost_operator.children.build import WORKLOAD_KINDS, adopted, build_children, scaled_to_zero, services_first
from rlboost_operator.children.disruption import DO_NOT_DISRUPT, disruption_budgets
from rlboost_operator.children.env_runner import STARTUP_TIMEOUT_S as ENV_RUNNER_STARTUP_TIMEOUT_S
from rlboost_operator.children.env_runner import env_runners
from rlboost_operator.children.job_config import CONFIG_HASH, OPERATOR_ONLY_FIELDS, config_hash, config_map
from rlboost_operator.children.job_labels import job_labels, with_job_labels
from rlboost_operator.children.manager import manager
from rlboost_operator.children.model import (
    FETCH_CONTAINER,
    TERMINATION_LOG,
    fetch_model_container,
    model_dir,
    model_mount,
    model_volume,
)
from rlboost_operator.children.naming import (
    ACCELERATOR_LABEL,
    CHECKPOINT_DIR,
    CONFIG_PATH,
    CREDENTIALS_DIR,
    IDENTITY_DIR,
    IDENTITY_TOKEN,
    IMAGES,
    MANAGER_PORT,
    METRICS_PORT,
    MODEL_DIR,
    MODEL_ROOT,
    NATS_CONFIG_DIR,
    NATS_MONITOR_PORT,
    NATS_PORT,
    PEER_PORT,
    RENDEZVOUS_PORT,
    SCRATCH_DIR,
    VARIANT_LABEL,
    WEIGHTS_PORT,
    WORKER_POOLS,
    image,
    labels,
    names,
    nats_host,
    nats_url,
    selector,
    site,
    spot_deployments,
    spot_variant_name,
    tls_hosts,
    workloads,
)
from rlboost_operator.children.nats import nats, nats_config_secret
from rlboost_operator.children.network_policy import OPERATOR_POD_LABELS, network_policy
from rlboost_operator.children.overlay import OverlayError, merge_template
from rlboost_operator.children.pod import credentials_volume
from rlboost_operator.children.policy import apply_policies, component_key
from rlboost_operator.children.secrets import credentials_secret, operator_nats_password, secret_items
from rlboost_operator.children.service_accounts import (
    IDENTITY_TOKEN_LIFETIME_S,
    account_name,
    identity_volume,
    service_account,
    service_accounts,
    worker_service_accounts,
)
from rlboost_operator.children.trainer import trainer
from rlboost_operator.children.weight_server import weight_server
from rlboost_operator.children.worker import WORKER_STARTUP_TIMEOUT_S, initial_reserved, spot_workers, worker

__all__ = [
    "ENV_RUNNER_STARTUP_TIMEOUT_S",
    "env_runners",
    "ACCELERATOR_LABEL",
    "CHECKPOINT_DIR",
    "CONFIG_HASH",
    "CONFIG_PATH",
    "DO_NOT_DISRUPT",
    "CREDENTIALS_DIR",
    "FETCH_CONTAINER",
    "IDENTITY_DIR",
    "IDENTITY_TOKEN",
    "IDENTITY_TOKEN_LIFETIME_S",
    "IMAGES",
    "MANAGER_PORT",
    "METRICS_PORT",
    "MODEL_DIR",
    "MODEL_ROOT",
    "NATS_CONFIG_DIR",
    "NATS_MONITOR_PORT",
    "NATS_PORT",
    "OPERATOR_ONLY_FIELDS",
    "OPERATOR_POD_LABELS",
    "OverlayError",
    "PEER_PORT",
    "RENDEZVOUS_PORT",
    "SCRATCH_DIR",
    "TERMINATION_LOG",
    "VARIANT_LABEL",
    "WEIGHTS_PORT",
    "WORKER_POOLS",
    "WORKER_STARTUP_TIMEOUT_S",
    "WORKLOAD_KINDS",
    "account_name",
    "adopted",
    "apply_policies",
    "build_children",
    "component_key",
    "config_hash",
    "config_map",
    "credentials_secret",
    "credentials_volume",
    "disruption_budgets",
    "fetch_model_container",
    "identity_volume",
    "image",
    "initial_reserved",
    "job_labels",
    "labels",
    "manager",
    "merge_template",
    "model_dir",
    "model_mount",
    "model_volume",
    "names",
    "nats",
    "nats_config_secret",
    "nats_host",
    "nats_url",
    "network_policy",
    "operator_nats_password",
    "scaled_to_zero",
    "secret_items",
    "selector",
    "service_account",
    "service_accounts",
    "services_first",
    "site",
    "spot_deployments",
    "spot_variant_name",
    "spot_workers",
    "tls_hosts",
    "trainer",
    "weight_server",
    "with_job_labels",
    "worker",
    "worker_service_accounts",
    "workloads",
]
