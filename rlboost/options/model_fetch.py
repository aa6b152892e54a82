"""The model-fetch init container's options: what `python -m rlboost.models.fetch` parses, and what the operator
renders for the init container of the trainer's and reserved workers' pods.

    ModelFetchOptions(config="/etc/rlboost/job.yaml", dest="/models/policy").command()
    # ['python', '-m', 'rlboost.models.fetch', '--config', '/etc/rlboost/job.yaml', '--dest', '/models/policy']
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from rlboost.options.base import CommandOptions

PROG = "rlboost-fetch-model"  # how the fetcher names itself in usage and in its one-line errors


class ModelFetchOptions(CommandOptions):
    """Fetch the job's policy model into a directory."""

    MODULE: ClassVar[str] = "rlboost.models.fetch"
    # Every flag is written by whoever runs it (the operator); no RLBOOST_* variable of a pod stands in for one.
    ENV_DEFAULTS: ClassVar[bool] = False

    config: str = Field(
        min_length=1, max_length=4096, description="The job spec YAML (spec.model says where the model is)."
    )
    dest: str = Field(min_length=1, max_length=4096, description="The model directory to fill ('pvc': to check).")
    token_file: str = Field("", max_length=4096, description="File holding the Hugging Face token ('' = $HF_TOKEN).")
    termination_log: str = Field("", max_length=4096, description="Also write the one-line error here (Kubernetes).")

    @classmethod
    def prog(cls) -> str:
        return PROG
