"""Names, labels, ports and paths of an RLJob's children: what the builders, the handlers and the job's services
agree on (a Service's DNS name, a mount path, the labels a watch selects on, the images)."""

from __future__ import annotations

from collections.abc import Sequence

from rlboost.options import ANY_ADDRESS, Site
from rlboost.spec import JobSpec
from rlboost_operator import spot_ask
from rlboost_operator.config import OperatorSettings

MANAGER_PORT, WEIGHTS_PORT, METRICS_PORT, RENDEZVOUS_PORT = 50051, 8000, 9090, 29500
PEER_PORT = 8700  # a worker serves the weights it holds to the job's other workers (peer fan-out)
CONFIG_PATH = "/etc/rlboost/job.yaml"
CHECKPOINT_DIR = "/data/checkpoints"  # on the trainer rank's PVC: a restarted trainer resumes from it
MODEL_ROOT, MODEL_DIR = "/models", "/models/policy"  # the model volume's mount, and the model directory in it
CREDENTIALS_DIR = "/etc/rlboost/credentials"  # each role's items of the job's credentials Secret
NATS_PORT, NATS_MONITOR_PORT, NATS_CONFIG_DIR = 4222, 8222, "/etc/nats"
SCRATCH_DIR = "/tmp"  # the one writable path of a read-only root filesystem (an emptyDir), also $HOME
IDENTITY_DIR = "/var/run/secrets/rlboost/identity"  # a worker's projected service-account token (its identity)
IDENTITY_TOKEN = f"{IDENTITY_DIR}/token"
WORKER_POOLS = ("reserved", "spot")
VARIANT_LABEL, ACCELERATOR_LABEL = spot_ask.VARIANT_LABEL, "rlboost.io/accelerator"  # a spot variant's pods

IMAGES = {
    "manager": "rollout-manager",
    "weights": "weight-server",
    "trainer": "trainer",
    "torch": "rollout-worker",
    "sglang": "rollout-worker-sglang",
    "env_runner": "env-runner",
}


def names(job: str) -> dict[str, str]:
    """Names of a job's children."""
    return {
        "config": f"{job}-config",
        "credentials": f"{job}-credentials",
        "nats": f"{job}-nats",
        "nats_config": f"{job}-nats-config",
        "network_policy": f"{job}-pods",
        "trainer": f"{job}-trainer",
        "manager": f"{job}-manager",
        "weights": f"{job}-weights",
        "reserved": f"{job}-workers-reserved",
        "spot": f"{job}-workers-spot",
        "reserved_account": f"{job}-reserved-worker",
        "spot_account": f"{job}-spot-worker",
        "env_runners": f"{job}-env-runners",
        # the services' own accounts (service_accounts.py; issue 29), each with the annotations its spec sets
        "trainer_account": f"{job}-trainer",
        "manager_account": f"{job}-manager",
        "weights_account": f"{job}-weight-server",
        "nats_account": f"{job}-nats",
        "env_runner_account": f"{job}-env-runner",
    }


def spot_variant_name(job: str, variant: str) -> str:
    """The Deployment of one spot variant (rollout.spot.variants)."""
    return f"{names(job)['spot']}-{variant}"


def spot_deployments(job: str, spec: JobSpec) -> list[str]:
    """The job's spot Deployments: one per variant, or the pool's single one."""
    variants = spec.rollout.spot.variants
    return [spot_variant_name(job, v.name) for v in variants] if variants else [names(job)["spot"]]


def workloads(job: str, variants: Sequence[str] = (), env_runners: bool = False) -> list[tuple[str, str]]:
    """(kind, name) of every child that runs pods: what scaling a job to zero patches; `variants`: the names of
    spot variants whose Deployments there may be; `env_runners`: the env-runners' Deployment too (a job with
    task.environment has one)."""
    n = names(job)
    deployments = ("nats", "manager", "weights", "reserved", "spot", *(("env_runners",) if env_runners else ()))
    variant_deployments = [("Deployment", spot_variant_name(job, v)) for v in variants]
    return [("StatefulSet", n["trainer"]), *(("Deployment", n[k]) for k in deployments), *variant_deployments]


def labels(job: str, component: str, pool: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "rlboost",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "rlboost",
        "app.kubernetes.io/managed-by": "rlboost-operator",
        "rlboost.io/job": job,
    }
    if pool:
        out["rlboost.io/pool"] = pool
    return out


def selector(job: str, component: str, pool: str | None = None) -> dict[str, str]:
    out = {"rlboost.io/job": job, "app.kubernetes.io/component": component}
    if pool:
        out["rlboost.io/pool"] = pool
    return out


def image(settings: OperatorSettings, key: str) -> str:
    return f"{settings.image_registry}/{IMAGES[key]}:{settings.image_tag}"


def nats_host(job: str, namespace: str) -> str:
    """The DNS name of the job's NATS Service (its TLS certificate names it)."""
    return f"{names(job)['nats']}.{namespace}.svc"


def nats_url(job: str, namespace: str) -> str:
    return f"nats://{nats_host(job, namespace)}:{NATS_PORT}"


def tls_hosts(job: str, namespace: str) -> dict[str, list[str]]:
    """Every name a TLS service of the job is dialled at, for its certificate."""
    n = names(job)
    services = {"manager": n["manager"], "weight-server": n["weights"], "nats": n["nats"]}
    return {
        tls: [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]
        for tls, name in services.items()
    }


def site(job: str, namespace: str, settings: OperatorSettings) -> Site:
    """What every container is told: the mounted job file, NATS, the others' Service addresses; binding 0.0.0.0."""
    n = names(job)
    return Site(
        config=CONFIG_PATH,
        nats_url=nats_url(job, namespace),
        namespace=namespace,
        job=job,
        bind_host=ANY_ADDRESS,
        manager_address=f"{n['manager']}.{namespace}.svc:{MANAGER_PORT}",
        # https: the weight-server serves TLS with the job CA's certificate for this name (tls_hosts)
        weight_server_url=f"https://{n['weights']}.{namespace}.svc:{WEIGHTS_PORT}",
        credentials_dir=CREDENTIALS_DIR,
    )
