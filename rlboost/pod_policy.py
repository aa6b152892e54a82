"""What a platform team sets on the pods of one component of a job (issue 29): the ServiceAccount they run as and
its annotations (IRSA, Workload Identity), env, envFrom, imagePullSecrets, a priority class, and a pod-template
overlay (tolerations, affinity, volumes and mounts, /dev/shm, labels, annotations, extra resources, image) that the
operator merges over the pod it builds (rlboost_operator.children.overlay; the rules are in docs/kubernetes.md).

The same fields sit on spec.trainer, spec.rollout.reserved, spec.rollout.spot (each of spec.rollout.spot.variants
adds its own podTemplate over the pool's), spec.rollout.envRunners and spec.services.manager / weightServer / nats.
What the operator owns in every pod is refused here, naming the field: a container's command and args, the job file, credentials and
identity-token volumes and their mount paths, the ServiceAccount and its token, the env variables it sets, and the
accelerator and CPU/memory requests that other spec fields set (the CRD's CEL rules refuse the same at apply).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from rlboost.spec_base import QUANTITY, SpecFieldError, SpecModel

K8S_NAME = r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"  # a DNS subdomain (Secrets, ConfigMaps, PriorityClasses)
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # containers' and volumes' names
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# A label or annotation key: an optional DNS-subdomain prefix and '/', then a name.
QUALIFIED_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^$|^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"

# What the operator owns in a job pod (rlboost_operator.children: naming.py, pod.py, service_accounts.py); tests
# check that these cover every volume, mount and env variable the builders make.
OWNED_VOLUMES = frozenset({"config", "credentials", "identity", "nats-config"})
OWNED_PATH_PREFIXES = ("/etc/rlboost", "/var/run/secrets/rlboost", "/etc/nats")
OWNED_ENV = frozenset(
    {
        "HOME",
        "XDG_CACHE_HOME",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "POD_NAME",
        "NODE_NAME",
        "HF_HUB_DISABLE_TELEMETRY",
    }
)
OWNED_ENV_PREFIX = "RLBOOST_"
OWNED_KEY_PREFIXES = ("rlboost.io/", "app.kubernetes.io/")  # the operator's labels and annotations
GPU_RESOURCE = "nvidia.com/gpu"
MAX_ENV = 128


def _check_keys(field: str, mapping: dict[str, str], value_pattern: str | None = None) -> None:
    """Every key of `field` (labels, annotations) a Kubernetes key, and with `value_pattern` every value a label's."""
    for key, value in mapping.items():
        if len(key) > 316 or not re.match(QUALIFIED_KEY, key):
            raise SpecFieldError(
                field, f"{key!r} is not a valid key (an optional 'prefix/' and a name, e.g. team/cost)"
            )
        if value_pattern and (len(value) > 63 or not re.match(value_pattern, value)):
            raise SpecFieldError(field, f"the value of {key!r} ({value!r}) is not a valid label value")


def _exactly_one(model: SpecModel, names: tuple[str, ...], where: str) -> None:
    given = [n for n in names if getattr(model, n) is not None]
    if len(given) != 1:
        choices = " or ".join(to_camel(n) for n in names)
        raise ValueError(f"{where} needs exactly one of {choices}")


class KubePart(SpecModel):
    """A part of a Kubernetes object: a field left unset (None) is left out when dumped, as Kubernetes omits it
    (the job file and the children carry no `command: null`)."""

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


# --- env, envFrom, imagePullSecrets ----------------------------------------------------------------------------


class KeySelector(SpecModel):
    """One key of a Secret or ConfigMap in the job's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=K8S_NAME, description="The Secret's or ConfigMap's name.")
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="The key in it.")
    optional: bool = Field(False, description="Start the pod even when the object or key is missing.")


class FieldSelector(SpecModel):
    """A field of the pod (the downward API), e.g. metadata.name or status.podIP."""

    field_path: str = Field(min_length=1, max_length=256, description="The pod field, e.g. 'metadata.namespace'.")


class EnvVarSource(KubePart):
    """Where an env variable's value comes from: exactly one of a Secret key, a ConfigMap key or a pod field."""

    secret_key_ref: KeySelector | None = Field(None, description="A key of a Secret in the job's namespace.")
    config_map_key_ref: KeySelector | None = Field(None, description="A key of a ConfigMap in the job's namespace.")
    field_ref: FieldSelector | None = Field(None, description="A field of the pod (downward API).")

    @model_validator(mode="after")
    def _one(self) -> EnvVarSource:
        _exactly_one(self, ("secret_key_ref", "config_map_key_ref", "field_ref"), "valueFrom")
        return self


def check_env_name(name: str) -> str:
    """An env variable the operator sets is not the user's to set (its value would break the service)."""
    if name in OWNED_ENV or name.startswith(OWNED_ENV_PREFIX):
        raise SpecFieldError(
            "name",
            f"env {name!r} is set by the operator (it owns {', '.join(sorted(OWNED_ENV))} and every "
            f"{OWNED_ENV_PREFIX}* variable); use another name",
        )
    return name


class EnvVar(KubePart):
    """An env variable, as in a Kubernetes container: a literal `value` or a `valueFrom` reference."""

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME, description="The variable's name.")
    value: str | None = Field(
        None, max_length=32768, description="A literal value (keep secrets in a Secret: valueFrom.secretKeyRef)."
    )
    value_from: EnvVarSource | None = Field(None, description="A Secret key, ConfigMap key or pod field.")

    @model_validator(mode="after")
    def _owned_and_single(self) -> EnvVar:
        check_env_name(self.name)
        if self.value is not None and self.value_from is not None:
            raise SpecFieldError("valueFrom", f"env {self.name!r}: set value or valueFrom, not both")
        return self


class ObjectRef(SpecModel):
    """A Secret or ConfigMap in the job's namespace, all of whose keys become env variables."""

    name: str = Field(min_length=1, max_length=253, pattern=K8S_NAME, description="The object's name.")
    optional: bool = Field(False, description="Start the pod even when the object is missing.")


class EnvFromSource(KubePart):
    """Every key of a Secret or ConfigMap as an env variable (e.g. WANDB_API_KEY, AWS_* for S3 without IRSA)."""

    prefix: str = Field(
        "", max_length=256, pattern=r"^$|^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Put before each key."
    )
    secret_ref: ObjectRef | None = Field(None, description="A Secret in the job's namespace.")
    config_map_ref: ObjectRef | None = Field(None, description="A ConfigMap in the job's namespace.")

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        _exactly_one(self, ("secret_ref", "config_map_ref"), "envFrom")
        if self.prefix.startswith(OWNED_ENV_PREFIX):
            raise SpecFieldError(
                "prefix", f"envFrom prefix {self.prefix!r}: {OWNED_ENV_PREFIX}* variables are the operator's"
            )
        return self


class LocalObjectReference(SpecModel):
    """An object of the job's namespace by name (an image pull Secret)."""

    name: str = Field(min_length=1, max_length=253, pattern=K8S_NAME, description="The Secret's name.")


class ServiceAccountSpec(SpecModel):
    """The ServiceAccount a component's pods run as: the operator's `<job>-<component>` account with these
    annotations (IRSA: eks.amazonaws.com/role-arn; GKE Workload Identity: iam.gke.io/gcp-service-account), or an
    existing account by `name` (trainer and services only: a worker's account is its identity to the manager)."""

    name: str = Field(
        "",
        max_length=253,
        pattern=r"^$|" + K8S_NAME[1:],
        description="An existing ServiceAccount of the job's namespace to run as instead of the operator-made one "
        "(its annotations are then yours; annotations must be empty). Not for worker pools.",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Annotations of the operator-made ServiceAccount, over the chart's jobServiceAccounts.annotations "
        "(e.g. eks.amazonaws.com/role-arn: arn:aws:iam::111122223333:role/rlboost-models).",
    )

    @model_validator(mode="after")
    def _one_way(self) -> ServiceAccountSpec:
        _check_keys("annotations", self.annotations)
        if self.name and self.annotations:
            raise SpecFieldError(
                "annotations",
                f"serviceAccount.name {self.name!r} is an existing account: annotate it yourself, or drop the name "
                "to have the operator make one with these annotations",
            )
        return self


# --- the pod-template overlay --------------------------------------------------------------------------------


class PassThrough(KubePart):
    """A Kubernetes object part: the fields listed are checked, any other field of the Kubernetes type passes
    through to the pod as written (x-kubernetes-preserve-unknown-fields in the CRD)."""

    model_config = ConfigDict(extra="allow")


class OverlayMount(PassThrough):
    """A volumeMount added to (or, at the same mountPath, replacing one of) a container's mounts."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="The volume mounted.")
    mount_path: str = Field(min_length=1, max_length=4096, description="Where in the container, e.g. /dev/shm.")

    @model_validator(mode="after")
    def _not_owned(self) -> OverlayMount:
        if self.name in OWNED_VOLUMES:
            raise SpecFieldError("name", f"volume {self.name!r} is the operator's (job file, credentials, identity)")
        if self.mount_path.rstrip("/").startswith(OWNED_PATH_PREFIXES):
            raise SpecFieldError(
                "mountPath", f"mountPath {self.mount_path!r} is under the operator's {', '.join(OWNED_PATH_PREFIXES)}"
            )
        return self


class OverlayResources(SpecModel):
    """Extra requests and limits, merged key by key (e.g. limits.memory, ephemeral-storage, rdma/ib). CPU and
    memory requests come from the component's `resources`, accelerators from gpusPerRank / gpusPerWorker."""

    limits: dict[str, str] = Field(default_factory=dict, max_length=16, description="Resource limits.")
    requests: dict[str, str] = Field(default_factory=dict, max_length=16, description="Resource requests.")

    @model_validator(mode="after")
    def _not_owned(self) -> OverlayResources:
        for kind in ("limits", "requests"):
            for key, value in getattr(self, kind).items():
                if not re.match(QUANTITY, value):
                    raise SpecFieldError(kind, f"resources.{kind}.{key}: {value!r} is not a Kubernetes quantity")
                if key == GPU_RESOURCE:
                    raise SpecFieldError(
                        kind, f"resources.{kind}.{key}: set accelerators with gpusPerRank / gpusPerWorker"
                    )
        owned = sorted({"cpu", "memory"} & set(self.requests))
        if owned:
            raise SpecFieldError(
                "requests", f"resources.requests.{owned[0]}: set it with the component's resources field"
            )
        return self


class OverlayContainer(PassThrough):
    """Changes to one of the pod's containers, matched by name (e.g. 'trainer', 'rollout-worker', 'fetch-model')."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="The container changed.")
    image: str | None = Field(None, min_length=1, max_length=1024, description="Another image for it.")
    command: list[str] | None = Field(None, description="Refused: the operator owns the command.")
    args: list[str] | None = Field(None, description="Refused: the operator owns the arguments.")
    env: list[dict[str, Any]] | None = Field(None, description="Refused: set the component's env.")
    env_from: list[dict[str, Any]] | None = Field(None, description="Refused: set the component's envFrom.")
    volume_mounts: list[OverlayMount] = Field(
        default_factory=list, max_length=64, description="Mounts added (a mountPath given twice: this one)."
    )
    resources: OverlayResources | None = Field(None, description="Extra requests and limits.")

    @model_validator(mode="before")
    @classmethod
    def _no_command(cls, data: Any) -> Any:
        for key in ("command", "args"):
            if isinstance(data, dict) and data.get(key) is not None:
                raise SpecFieldError(
                    key,
                    f"the operator owns each container's {key} (rendered from the spec); remove podTemplate's {key}",
                )
        for key in ("env", "envFrom"):
            if isinstance(data, dict) and data.get(key) is not None:
                raise SpecFieldError(key, f"set {key} on the component (every container gets it), not in podTemplate")
        return data


class OverlayVolume(PassThrough):
    """A volume added to the pod (or replacing the operator's of that name, e.g. a larger 'model' or 'scratch')."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL, description="The volume's name.")

    @model_validator(mode="after")
    def _not_owned(self) -> OverlayVolume:
        if self.name in OWNED_VOLUMES:
            raise SpecFieldError(
                "name", f"volume {self.name!r} is the operator's (the job file, credentials or identity token)"
            )
        return self


_REFUSED_POD_FIELDS = {
    "service_account_name": "set serviceAccount (annotations, or name) instead",
    "service_account": "set serviceAccount (annotations, or name) instead",
    "automount_service_account_token": "job pods mount no API token (workers get their identity token)",
    "priority_class_name": "set the component's priorityClassName instead",
    "image_pull_secrets": "set the component's imagePullSecrets instead",
}


AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
AFFINITY_WHEN = ("requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution")


class OverlayPodSpec(PassThrough):
    """Changes to the pod's spec: lists merged by name (containers, initContainers, volumes), tolerations and
    topology constraints appended, affinity terms added to the operator's, nodeSelector merged, any other field
    set as written."""

    containers: list[OverlayContainer] = Field(default_factory=list, max_length=8, description="By name.")
    init_containers: list[OverlayContainer] = Field(default_factory=list, max_length=8, description="By name.")
    volumes: list[OverlayVolume] = Field(default_factory=list, max_length=64, description="Added, by name.")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, max_length=64, description="Added to the operator's (e.g. a team's node taint)."
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict,
        description="Added to the operator's: nodeAffinity's required terms are ANDed into each of its terms, "
        "every other term is appended.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=32, description="Merged, key by key.")
    service_account_name: str | None = Field(None, description="Refused: see serviceAccount.")
    service_account: str | None = Field(None, description="Refused: see serviceAccount.")
    automount_service_account_token: bool | None = Field(None, description="Refused: job pods mount no API token.")
    priority_class_name: str | None = Field(None, description="Refused: see priorityClassName.")
    image_pull_secrets: list[dict[str, Any]] | None = Field(None, description="Refused: see imagePullSecrets.")

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for field, fix in _REFUSED_POD_FIELDS.items():
                key = to_camel(field)
                if data.get(key, data.get(field)) is not None:
                    raise SpecFieldError(key, f"podTemplate.spec.{key} is the operator's; {fix}")
        return data

    @field_validator("affinity")
    @classmethod
    def _affinity_shape(cls, affinity: dict[str, Any]) -> dict[str, Any]:
        """Kubernetes' Affinity shape, which the operator's merge reads (overlay.py)."""
        for kind, terms in affinity.items():
            if kind not in AFFINITY_KINDS or not isinstance(terms, dict):
                raise ValueError(f"affinity.{kind}: an object under one of {', '.join(AFFINITY_KINDS)}")
            for when, value in terms.items():
                node_required = kind == "nodeAffinity" and when == AFFINITY_WHEN[0]
                if node_required:
                    fits = isinstance(value, dict) and isinstance(value.get("nodeSelectorTerms", []), list)
                else:
                    fits = when in AFFINITY_WHEN and isinstance(value, list)
                if not fits:
                    shape = "an object with a list nodeSelectorTerms" if node_required else "a list of terms"
                    raise ValueError(f"affinity.{kind}.{when}: one of {', '.join(AFFINITY_WHEN)}, {shape}")
        return affinity

    @model_validator(mode="after")
    def _distinct(self) -> OverlayPodSpec:
        for kind in ("containers", "init_containers", "volumes"):
            seen = [item.name for item in getattr(self, kind)]
            twice = sorted({n for n in seen if seen.count(n) > 1})
            if twice:
                raise SpecFieldError(to_camel(kind), f"{to_camel(kind)} names {twice[0]!r} twice; name each once")
        return self


class OverlayMetadata(SpecModel):
    """Labels and annotations added to the pods (e.g. cost allocation, a mesh's opt-out)."""

    labels: dict[str, str] = Field(default_factory=dict, max_length=64, description="Added to the pod's labels.")
    annotations: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="Added to the pod's annotations."
    )

    @model_validator(mode="after")
    def _not_owned(self) -> OverlayMetadata:
        _check_keys("labels", self.labels, LABEL_VALUE)
        _check_keys("annotations", self.annotations)
        for kind in ("labels", "annotations"):
            owned = sorted(k for k in getattr(self, kind) if k.startswith(OWNED_KEY_PREFIXES))
            if owned:
                raise SpecFieldError(
                    kind, f"{kind} key {owned[0]!r}: {' and '.join(OWNED_KEY_PREFIXES)} keys are the operator's"
                )
        return self


class PodTemplateOverlay(SpecModel):
    """A pod-template overlay merged over the pod the operator builds (Kubernetes' own shape, partial)."""

    metadata: OverlayMetadata = Field(default_factory=OverlayMetadata, description="Labels and annotations added.")
    spec: OverlayPodSpec = Field(default_factory=OverlayPodSpec, description="Changes to the pod's spec.")

    def is_empty(self) -> bool:
        return self == PodTemplateOverlay()

    def manifest(self) -> dict[str, Any]:
        """The overlay as Kubernetes fields (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True, mode="json")


# --- the fields a component gets -----------------------------------------------------------------------------


class PodPolicy(SpecModel):
    """The pod fields a platform team sets on one component of a job (Kubernetes only; `rlboost local` ignores
    them)."""

    service_account: ServiceAccountSpec = Field(
        default_factory=ServiceAccountSpec,
        description="The ServiceAccount the component's pods run as (annotations for IRSA / Workload Identity).",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description="Env variables of every container of the component's pods (the model fetcher's too), e.g. "
        "WANDB_API_KEY from a Secret: {name: WANDB_API_KEY, valueFrom: {secretKeyRef: {name: wandb, key: key}}}.",
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets or ConfigMaps whose every key becomes an env variable of every container.",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=16,
        description="Pull Secrets (in the job's namespace) for private registries, besides the chart's images.pullSecrets.",
    )
    priority_class_name: str = Field(
        "",
        max_length=253,
        pattern=r"^$|" + K8S_NAME[1:],
        description="The PriorityClass of the component's pods (e.g. one that preempts batch work for the trainer).",
    )
    pod_template: PodTemplateOverlay = Field(
        default_factory=PodTemplateOverlay,
        description="A pod-template overlay merged over the pods the operator builds: metadata.labels / "
        "annotations; spec.tolerations, affinity, nodeSelector, volumes; spec.containers[name].image, env, "
        "volumeMounts, resources (e.g. /dev/shm: a volume {name: dshm, emptyDir: {medium: Memory, sizeLimit: 8Gi}} "
        "mounted at /dev/shm). The operator's own fields are refused (docs/kubernetes.md).",
    )

    @field_validator("env")
    @classmethod
    def _distinct_env(cls, env: list[EnvVar]) -> list[EnvVar]:
        names = [e.name for e in env]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"env names {twice[0]!r} twice; set each variable once")
        return env


def no_account_name(policy: PodPolicy) -> None:
    """A worker pool runs as the operator's account of that pool: its projected token is what the manager binds
    the pool to (rlboost_operator.children.service_accounts)."""
    if policy.service_account.name:
        raise SpecFieldError(
            "serviceAccount.name",
            "a worker pool runs as the operator's <job>-reserved-worker / <job>-spot-worker account (the manager "
            "checks its token to know the pool): set serviceAccount.annotations instead of a name",
        )
