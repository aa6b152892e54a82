"""Operator settings: images, NATS, limits. Read from RLBOOST_OPERATOR_* environment variables.

The Helm chart sets them on the operator Deployment; tests set them before starting kopf.
"""

from __future__ import annotations

import json
import os
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

ENV_PREFIX = "RLBOOST_OPERATOR_"


class OperatorSettings(BaseModel):
    """What the operator needs beyond each RLJob's spec."""

    image_registry: str = Field("ghcr.io/rlboost", description="Registry and path prefix of the rlboost images.")
    image_tag: str = Field("0.1.0", description="Tag of every rlboost image.")
    image_pull_policy: str = Field("IfNotPresent", description="imagePullPolicy of the job's containers.")
    nats_url: str = Field(
        "",
        description="Where the operator reaches each job's own NATS: '' = the job's Service "
        "(nats://<job>-nats.<namespace>.svc:4222, what the job's pods use); else a URL that may hold {job} and "
        "{namespace} (a port-forward, tests). TLS is verified against the Service's name either way.",
    )
    nats_image: str = Field("nats:2.10.29-alpine", min_length=1, description="Image of each job's NATS server.")
    network_policy: bool = Field(True, description="Give every job a NetworkPolicy (only its own pods reach it).")
    metrics_namespace_labels: dict[str, str] = Field(
        default_factory=lambda: {"kubernetes.io/metadata.name": "monitoring"},
        description="Labels (JSON) of the namespaces whose pods may scrape job pods' metrics ports; {} = none.",
    )
    service_account_annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Annotations (JSON) of every ServiceAccount the operator makes for a job's pods (the chart's "
        "jobServiceAccounts.annotations); a component's spec serviceAccount.annotations go over them.",
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list,
        description="Image pull Secrets (JSON list of names; the chart's images.pullSecrets) every job pod gets; "
        "they must exist in the job's namespace.",
    )
    operator_namespace: str = Field(
        "", description="Namespace of the operator's pods (they reach each job's NATS); '' = any namespace."
    )
    max_trainer_ranks: int = Field(64, ge=1, description="Most trainer ranks the trainer pool can hold.")
    max_trainer_gpus: int = Field(512, ge=0, description="Most accelerators the trainer pool can hold.")
    weights_storage: str = Field("20Gi", description="Size of the weight-server's PVC.")
    storage_class: str = Field("", description="StorageClass of the job's PVCs; empty = the cluster default.")
    trainer_storage: str = Field("20Gi", description="Size of each trainer rank's checkpoint volume.")
    rescale_interval_s: float = Field(30.0, gt=0, description="Safety-net period of the spot rescale timer.")
    identity_refresh_s: float = Field(
        300.0,
        gt=0,
        description="Period of the re-read of the cluster's service-account signing keys (a rotation reaches each "
        "job's manager through its credentials item worker-identity.json within this).",
    )
    spot_sizing: Literal["autoscaler", "capacity"] = Field(
        "capacity",
        description="Sizing of spot pools whose RLJob says sizing 'default': 'autoscaler' asks for maxReplicas so "
        "an autoscaler provisions spot nodes; 'capacity' sizes to the spot nodes present.",
    )
    spot_pending_timeout_s: float = Field(
        600.0, gt=0, description="Autoscaler sizing: spot pods unschedulable this long shrink the ask."
    )
    spot_retry_backoff_s: float = Field(
        600.0, gt=0, description="Autoscaler sizing: first wait after a shrink before asking for maxReplicas again."
    )
    spot_retry_backoff_max_s: float = Field(
        3600.0, gt=0, description="Autoscaler sizing: the wait doubles after each shrink, up to this."
    )
    spot_probe_workers: int = Field(
        1, ge=0, description="Autoscaler sizing: pods asked for beyond those placed while backing off."
    )
    # --- Kueue and suspension (issue 30) ---
    kueue: bool = Field(
        False,
        description="Kueue integration: an RLJob labelled kueue.x-k8s.io/queue-name gets a Workload and runs only "
        "while Kueue admits it (Kueue configured with integrations.externalFrameworks: RLJob.v1alpha1.rlboost.io).",
    )
    suspend_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="How long a suspension (spec.suspend, a Kueue eviction) waits for the trainer to checkpoint at a "
        "step boundary before the job goes to zero anyway (it then resumes from its newest periodic checkpoint).",
    )

    @field_validator("metrics_namespace_labels", "service_account_annotations", "image_pull_secrets", mode="before")
    @classmethod
    def _json_labels(cls, value: object) -> object:
        """An environment variable holds them as JSON."""
        return json.loads(value) if isinstance(value, str) else value


def load_settings(environ: dict[str, str] | None = None) -> OperatorSettings:
    """Settings from RLBOOST_OPERATOR_<FIELD> variables; a bad value exits with the variable's name."""
    env = os.environ if environ is None else environ
    raw = {
        name: env[ENV_PREFIX + name.upper()]
        for name in OperatorSettings.model_fields
        if ENV_PREFIX + name.upper() in env
    }
    try:
        return OperatorSettings.model_validate(raw)
    except ValidationError as err:
        bad = "; ".join(f"{ENV_PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}" for e in err.errors())
        raise SystemExit(f"rlboost-operator: invalid setting: {bad}") from None
