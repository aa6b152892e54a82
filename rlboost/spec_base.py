"""The base of every job spec model (rlboost.spec and the pod policy models in rlboost.pod_policy): camelCase
aliases, unknown fields refused, and the error a cross-field rule raises to name its field."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"  # a Kubernetes resource quantity, as requests take it


class SpecFieldError(ValueError):
    """A cross-field rule that one field must change to satisfy; `path` names it (camelCase, dotted, relative
    to the model whose validator raised it), so the error's field path is data, not prose."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


class SpecModel(BaseModel):
    """Base: camelCase aliases, unknown fields rejected, assignment validated."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_assignment=True)
