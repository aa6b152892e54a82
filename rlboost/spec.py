"""The RL job specification: one pydantic model tree, loaded from YAML.

The same fields are the `spec` of the `RLJob` custom resource (camelCase on the wire,
snake_case in Python). Every field has bounds and a description, which also become the
CRD's OpenAPI schema. Load a file with `load_job_spec(path)`; errors name the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import yaml
from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from rlboost.config_file import ConfigFileError, load_yaml_file
from rlboost.environment_registry import check_environment_name
from rlboost.pod_policy import PodPolicy, PodTemplateOverlay, no_account_name
from rlboost.reward_registry import check_reward_name
from rlboost.spec_base import QUANTITY, SpecFieldError, SpecModel
from rlboost.step_sizing import fits_step_limit, in_flight

MODEL_SOURCES = ("tiny", "path", "huggingface", "uri", "pvc")
URI_SCHEMES = ("s3://", "gs://")
# The fields each source reads besides `source`; a location field set for another source is a mistake.
SOURCE_FIELDS: dict[str, tuple[str, ...]] = {
    "tiny": ("path",),
    "path": ("path",),
    "huggingface": ("repo", "revision", "token_secret"),
    "uri": ("uri",),
    "pvc": ("claim_name", "path"),
}
_K8S_NAME = r"^$|^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$"  # a DNS subdomain, or unset
MAX_GROUP_SIZE = 1024  # algorithm.groupSize's bound; the rollout-manager refuses a Rollout call above it too
MAX_NEW_TOKENS = 131072  # algorithm.maxNewTokens's bound, likewise
MAX_WORKER_CAPACITY = 100000  # a pool's capacity bound; the rollout-manager refuses a registration above it too


class ModelSpec(SpecModel):
    """The policy model and its tokenizer, and where it comes from."""

    source: Literal["tiny", "path", "huggingface", "uri", "pvc"] = Field(
        "tiny",
        description="'tiny': create a small random-init Qwen3 model with warm-up; 'path': a HF model directory on "
        "the machine (local runs); 'huggingface': download `repo` at `revision` from the Hugging Face Hub; 'uri': "
        "copy a HF model directory from object storage (`uri`, s3:// or gs://); 'pvc': an existing "
        "PersistentVolumeClaim `claimName`, the model directory at `path` inside it.",
    )
    path: str = Field(
        "",
        max_length=4096,
        description="'path': the HF model directory (safetensors + tokenizer). 'tiny': where to create it; empty = "
        "inside the run directory. 'pvc': the model directory inside the claim, relative ('' = the claim's root).",
    )
    repo: str = Field(
        "",
        max_length=256,
        pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="'huggingface': the Hub repository id, 'owner/name' (e.g. 'Qwen/Qwen3-0.6B').",
    )
    revision: str = Field(
        "main",
        min_length=1,
        max_length=256,
        description="'huggingface': branch, tag or commit of `repo`; pin a commit hash for a reproducible run.",
    )
    token_secret: str = Field(
        "",
        max_length=253,
        pattern=_K8S_NAME,
        description="'huggingface': name of a Secret in the job's namespace whose key `token` holds a Hub access "
        "token (gated or private repositories); empty = anonymous.",
    )
    uri: str = Field(
        "",
        max_length=4096,
        description="'uri': the model directory in object storage, 's3://bucket/prefix' or 'gs://bucket/prefix'. "
        "Credentials come from the pod's environment: IRSA on EKS, Workload Identity on GKE.",
    )
    claim_name: str = Field(
        "",
        max_length=253,
        pattern=_K8S_NAME,
        description="'pvc': name of an existing PersistentVolumeClaim in the job's namespace holding the model "
        "(mounted read-only; ReadOnlyMany or ReadWriteMany when pods on several nodes read it).",
    )
    hidden_size: int = Field(128, ge=16, le=8192, description="Hidden size of the tiny model.")
    num_layers: int = Field(2, ge=1, le=64, description="Transformer layers of the tiny model.")
    num_heads: int = Field(4, ge=1, le=64, description="Attention heads of the tiny model.")
    warmup_steps: int = Field(
        175, ge=0, le=10000, description="Supervised warm-up steps on the task's format when the tiny model is created."
    )
    seed: int = Field(0, ge=0, description="Seed of the tiny model's initialisation and warm-up.")

    @model_validator(mode="after")
    def _source_fields(self) -> ModelSpec:
        required = {"huggingface": "repo", "uri": "uri", "pvc": "claim_name", "path": "path"}.get(self.source)
        if required and not getattr(self, required):
            raise SpecFieldError(to_camel(required), f"model.source '{self.source}' needs model.{to_camel(required)}")
        for name in ("repo", "token_secret", "uri", "claim_name"):
            if getattr(self, name) and name not in SOURCE_FIELDS[self.source]:
                raise SpecFieldError(
                    to_camel(name),
                    f"model.{to_camel(name)} is not read by model.source '{self.source}'; remove it or set "
                    f"model.source to '{_source_reading(name)}'",
                )
        if self.source == "uri" and not self.uri.startswith(URI_SCHEMES):
            raise SpecFieldError(
                "uri", f"model.uri {self.uri!r} must start with s3:// or gs:// (e.g. s3://my-bucket/models/qwen3)"
            )
        if self.source == "uri" and not self.uri.split("://", 1)[1].strip("/"):
            raise SpecFieldError("uri", f"model.uri {self.uri!r} names no bucket")
        if self.source == "pvc" and (self.path.startswith("/") or ".." in Path(self.path).parts):
            raise SpecFieldError(
                "path", f"model.path {self.path!r} must be relative to the claim's root, without '..' (e.g. 'qwen3')"
            )
        return self


def _source_reading(field: str) -> str:
    return next(source for source, fields in SOURCE_FIELDS.items() if field in fields)


DATASET_FORMATS = ("auto", "jsonl", "parquet", "hf-disk")
DATASET_SCHEMES = ("s3://", "gs://", "hf://", "file://")


_RG_CONFIG_SCHEMA = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "description": "Further keyword arguments of the reasoning-gym dataset's config (e.g. difficulty knobs such as "
    "min_terms / max_terms / min_digits / max_digits for basic_arithmetic), JSON values.",
}


def json_values(value: Any, field: str, depth: int = 0) -> Any:
    """`value` if it is plain JSON (strings as keys, finite numbers, at most 32 levels), which the CRD stores and a
    dump reads back unchanged; else a ValueError naming `field` (a non-finite number would come back as another)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{field}: {value} is not a JSON number; give a finite number")
    if depth > 32:
        raise ValueError(f"{field}: nested deeper than 32 levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{field}: key {key!r} is not a string")
            json_values(item, f"{field}.{key}", depth + 1)
    elif isinstance(value, list):
        for n, item in enumerate(value):
            json_values(item, f"{field}.{n}", depth + 1)
    elif value is not None and not isinstance(value, str | int | float):
        raise ValueError(f"{field}: {type(value).__name__} is not a JSON value")
    return value


class ReasoningGymSpec(SpecModel):
    """reasoning-gym's procedural tasks as the prompts (PyPI `reasoning-gym`): generated from a seed, no network, each
    scored by the task's own `score_answer` (the `reasoning_gym` reward)."""

    name: str = Field(
        "",
        max_length=64,
        pattern=r"^$|^[a-z0-9_]+$",
        description="A reasoning-gym dataset name (e.g. basic_arithmetic, chain_sum, letter_counting, "
        "spell_backward, gsm_symbolic); '' = none. Checked against reasoning-gym's registry before the first step.",
    )
    size: int = Field(1000, ge=1, le=10**6, description="Tasks generated (the prompt set the steps go through).")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed of the generator: the same seed, the same tasks.")
    config: Annotated[dict[str, Any], WithJsonSchema(_RG_CONFIG_SCHEMA)] = Field(
        default_factory=dict, description=_RG_CONFIG_SCHEMA["description"]
    )

    @field_validator("config")
    @classmethod
    def _no_size_or_seed(cls, config: dict[str, Any]) -> dict[str, Any]:
        clash = sorted({"size", "seed"} & set(config))
        if clash:
            raise ValueError(f"task.dataset.reasoningGym.config: set {', '.join(clash)} as reasoningGym's own field")
        return json_values(config, "task.dataset.reasoningGym.config")


class DatasetSpec(SpecModel):
    """A prompt dataset: JSONL / Parquet files or a Hugging Face `datasets` directory, streamed (never loaded whole)."""

    train: str = Field(
        "",
        max_length=4096,
        description="'' = no dataset (the built-in task). The training split: a file, a directory (its *.jsonl / *.parquet files, or a "
        "`datasets.save_to_disk` directory), a glob ('data/train-*.parquet'), or a URI: s3://, gs://, "
        "hf://datasets/<owner>/<name>/<files> (a Hugging Face Hub dataset repository). On Kubernetes a local path is "
        "read inside the trainer's pod (e.g. a PVC mounted there).",
    )
    validation: str = Field(
        "",
        max_length=4096,
        description="The validation split (same forms as `train`), read in file order by evaluation; '' = none.",
    )
    format: Literal["auto", "jsonl", "parquet", "hf-disk"] = Field(
        "auto",
        description="File format; 'auto' goes by the extension (.jsonl/.json -> jsonl, .parquet -> parquet) or, for a "
        "directory with dataset_info.json / dataset_dict.json, 'hf-disk' (written by datasets' save_to_disk).",
    )
    split: str = Field(
        "",
        max_length=128,
        pattern=r"^$|^[A-Za-z0-9_.-]+$",
        description="'hf-disk' with a DatasetDict (several splits in one directory): the split that `train` names "
        "(default 'train'); `validation` may name the same directory and uses 'validation'.",
    )
    prompt_field: str = Field(
        "prompt",
        min_length=1,
        max_length=256,
        description="The column holding the prompt: plain text (one user turn) or chat messages (a list of "
        "{role, content}); either goes through the model tokenizer's chat template.",
    )
    answer_field: str = Field(
        "answer",
        min_length=1,
        max_length=256,
        description="The column holding the reference answer handed to the reward (converted to text).",
    )
    metadata_fields: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Further columns handed to the reward as `example.metadata` (a dict, JSON values).",
    )
    max_prompt_tokens: int = Field(
        1024,
        ge=1,
        le=131072,
        description="Longest prompt in tokens (after the chat template); longer ones are skipped and counted "
        "(step report `prompts_skipped`), never truncated.",
    )
    shuffle: bool = Field(True, description="Visit the training rows in a seeded shuffle (task.seed), new each epoch.")
    shuffle_window_blocks: int = Field(
        16,
        ge=1,
        le=4096,
        description="Blocks (Parquet row groups / 1024-line JSONL chunks) shuffled together: the block order is "
        "permuted, then rows are permuted within each window of this many blocks. Bounds the loader's memory.",
    )
    epochs: int = Field(
        0,
        ge=0,
        le=10**6,
        description="Passes over the training split; training ends after them even before algorithm.steps "
        "(a final partial batch is dropped). 0 = as many as algorithm.steps needs.",
    )
    system_prompt: str = Field(
        "",
        max_length=65536,
        description="A system message put before each prompt that has none; '' = none.",
    )
    enable_thinking: Literal["auto", "on", "off"] = Field(
        "auto",
        description="'on' / 'off': passed to the chat template as enable_thinking=true/false (Qwen3-style thinking) "
        "where the template reads it; 'auto' = the template's default.",
    )

    reasoning_gym: ReasoningGymSpec = Field(
        default_factory=ReasoningGymSpec,
        description="Prompts from reasoning-gym's generators instead of files ({name, size, seed}), scored by the "
        "task's own score_answer (task.reward defaults to reasoning_gym with it); train must then be unset.",
    )

    @property
    def thinking(self) -> bool | None:
        """enable_thinking as the chat template takes it (None: not passed)."""
        return {"on": True, "off": False}.get(self.enable_thinking)

    @model_validator(mode="after")
    def _locations(self) -> DatasetSpec:
        if self.reasoning_gym.name and (self.train or self.validation):
            raise SpecFieldError(
                "reasoningGym",
                "task.dataset.reasoningGym is set together with task.dataset.train/validation: the prompts come from "
                "one of them; unset the other",
            )
        if self.validation and not self.train:
            raise SpecFieldError("train", "task.dataset.validation is set but task.dataset.train is not; set both")
        for name in ("train", "validation"):
            value = getattr(self, name)
            if "://" in value and not value.startswith(DATASET_SCHEMES):
                raise SpecFieldError(
                    name,
                    f"task.dataset.{name} {value!r}: unsupported scheme; use a path or s3://, gs://, hf://datasets/...",
                )
        if self.prompt_field == self.answer_field:
            raise SpecFieldError(
                "answerField", f"task.dataset.answerField must differ from promptField ({self.prompt_field!r})"
            )
        return self


class RewardTerm(SpecModel):
    """One reward of a weighted sum: an entry point of the group 'rlboost.rewards', its weight, its parameters."""

    name: str = Field(
        max_length=128,
        description="Entry point name in the group 'rlboost.rewards' (built-ins: math_verify, exact_match, "
        "regex_match, format, format_reward, math_answer, reasoning_gym).",
    )
    weight: float = Field(
        1.0, ge=-1000, le=1000, description="Multiplies this reward's value in the sum (negative: a penalty)."
    )
    params: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        max_length=32,
        description="Keyword arguments of the reward function, e.g. {pattern: '\\d+'} for regex_match or "
        "{style: boxed} for format (boxed, answer_tag, think_answer, integer).",
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        check_reward_name(name)  # RewardNameError (a ValueError): names task.reward, the choices and the fix
        return name


# task.reward is a name or a list; a Kubernetes structural schema has no string-or-list type, so the CRD keeps
# the value as given (preserve-unknown-fields) and pydantic (operator, trainer, `rlboost local`) validates it.
_REWARD_SCHEMA = {
    "x-kubernetes-preserve-unknown-fields": True,
    "description": "Reward: an entry point name of the group 'rlboost.rewards' (e.g. math_verify), or a weighted "
    "list of them, summed per sample: [{name: math_verify, weight: 1.0}, {name: format, weight: 0.1, params: "
    "{style: boxed}}]. Built-ins: math_verify (HF math-verify), exact_match, regex_match (params.pattern), "
    "format (params.style), format_reward, math_answer, reasoning_gym (reasoning-gym's own score_answer, the default "
    "with task.dataset.reasoningGym). It runs confined: a separate process with the limits "
    "below, no network, no exec; a call that fails or times out scores 0 and is counted.",
}


_REWARD_NAME, _REWARD_LIST = "reward-name", "reward-list"  # union tags; spec_problems leaves them out of paths


def _reward_form(value: object) -> str | None:
    if isinstance(value, str):
        return _REWARD_NAME
    return _REWARD_LIST if isinstance(value, list | tuple) else None


_ENV_ARGS_SCHEMA = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "description": "Keyword arguments of the environment's factory (JSON values).",
}


class EnvironmentSpec(SpecModel):
    """An environment the model acts in for several turns (agentic episodes): a plain Python environment
    registered under `rlboost.environments`, or a `verifiers` environment by id. It runs in env-runner processes,
    confined as rewards are."""

    name: str = Field(
        "",
        max_length=128,
        description="An entry point of the group 'rlboost.environments' (built-in: calculator); '' = none.",
    )
    verifiers: str = Field(
        "",
        max_length=128,
        pattern=r"^$|^[A-Za-z0-9_.@/+\-]+$",
        description="A verifiers (0.4) environment id: its taskset's id (an installed package, e.g. 'my-taskset'), "
        "or '<env id>+<taskset id>'; '' = none. Its tasks are the prompts; `args` merge into its verifiers config "
        "(e.g. {taskset: {num_tasks: 50}, agent: {harness: {id: null}}}). Checked before the first step.",
    )
    args: Annotated[dict[str, Any], WithJsonSchema(_ENV_ARGS_SCHEMA)] = Field(
        default_factory=dict, description=_ENV_ARGS_SCHEMA["description"]
    )
    step_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Wall time one environment call (reset, or a step: its tools) may take; past it the "
        "environment's process is killed and the episode fails (reason 'timeout').",
    )
    cpu_seconds: int = Field(
        60, ge=1, le=86400, description="CPU seconds one environment call may use (RLIMIT_CPU); past it: 'cpu'."
    )
    memory_mib: int = Field(
        2048, ge=64, le=1 << 20, description="Address space of an environment process (RLIMIT_AS), MiB."
    )

    @property
    def active(self) -> bool:
        return bool(self.name or self.verifiers)

    @property
    def field(self) -> str:
        """The field that names the environment, for messages."""
        return "task.environment.verifiers" if self.verifiers else "task.environment.name"

    @field_validator("args")
    @classmethod
    def _json_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        return json_values(args, "task.environment.args")

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name:
            check_environment_name(name)  # EnvironmentNameError (a ValueError): names the field and the fix
        return name

    @model_validator(mode="after")
    def _one(self) -> EnvironmentSpec:
        if self.name and self.verifiers:
            raise SpecFieldError("verifiers", "task.environment: set either name or verifiers, not both")
        return self


class TaskSpec(SpecModel):
    """The task: the built-in addition prompts (generated from a seed), or a dataset; a reward checked by code."""

    name: Literal["addition", "multiplication"] = Field(
        "addition",
        description="Built-in task: 'addition' asks for the sum of two integers, 'multiplication' for their product "
        "(made for a calculator tool: task.environment.name calculator).",
    )
    max_operand: int = Field(5, ge=1, le=10**6, description="Operands are drawn from 0..max_operand.")
    num_prompts: int = Field(400, ge=1, le=10**7, description="Size of the prompt set generated from the seed.")
    seed: int = Field(1234, ge=0, description="Seed of the prompt set and its order (also a dataset's shuffle).")
    dataset: DatasetSpec = Field(
        default_factory=DatasetSpec,
        description="Train on a prompt dataset instead of the built-in task (name, maxOperand and numPrompts are "
        "then unused) when dataset.train is set.",
    )
    reward: Annotated[
        Annotated[str, Tag(_REWARD_NAME)] | Annotated[list[RewardTerm], Tag(_REWARD_LIST)],
        Discriminator(
            _reward_form,
            custom_error_type="reward_form",
            custom_error_message="must be an entry point name (e.g. math_verify) or a list of {name, weight, params}",
        ),
        WithJsonSchema(_REWARD_SCHEMA),
    ] = Field(
        "exact_match",
        description=_REWARD_SCHEMA["description"],
    )
    reward_timeout_seconds: float = Field(
        10.0, gt=0, le=3600, description="Wall time one reward call may take; past it the sample's reward is 0."
    )
    reward_cpu_seconds: int = Field(
        10, ge=1, le=3600, description="CPU seconds one reward call may use (RLIMIT_CPU); past it the reward is 0."
    )
    reward_memory_mib: int = Field(
        1024, ge=64, le=1 << 20, description="Address space of a reward process (RLIMIT_AS), MiB; a hog's reward is 0."
    )
    reward_processes: int = Field(
        2, ge=1, le=64, description="Long-lived reward sandbox processes; a step's samples are scored in batches."
    )
    environment: EnvironmentSpec = Field(
        default_factory=EnvironmentSpec,
        description="Agentic episodes: an environment (its tools) the model acts in for up to "
        "algorithm.maxTurns turns, run by the env-runner pool (rollout.envRunners); unset = single-turn samples.",
    )
    # issue 31: a step's reward time is bounded; what the budget cuts fails with kind 'budget', not a real zero
    reward_step_budget_seconds: float = Field(
        600.0,
        ge=0,
        le=86400,
        description="Wall time the reward sandbox may spend on one batch of a step's samples (the processes take "
        "them from one queue). A sample still running when it ends, and those not started, fail with kind 'budget' "
        "(counted in the step's rewardFailures, kept out of their group's baseline). 0 = no budget.",
    )

    @property
    def active_dataset(self) -> DatasetSpec | None:
        """The dataset the job trains on, or None for the built-in task (task.dataset.train unset)."""
        return self.dataset if self.dataset.train else None

    @property
    def episodes(self) -> bool:
        """The job trains on agentic episodes (task.environment is set)."""
        return self.environment.active

    @model_validator(mode="after")
    def _one_prompt_source(self) -> TaskSpec:
        if self.environment.verifiers and (self.dataset.train or self.dataset.reasoning_gym.name):
            raise SpecFieldError(
                "environment.verifiers",
                "task.environment.verifiers: a verifiers environment's prompts are its own tasks; unset "
                "task.dataset.train and task.dataset.reasoningGym (or use task.environment.name)",
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _reasoning_gym_scores(cls, data: Any) -> Any:
        """reasoning-gym's tasks are scored by their own score_answer unless task.reward says otherwise."""
        if isinstance(data, dict) and "reward" not in data:
            dataset = data.get("dataset")
            rg = (dataset.get("reasoningGym") or dataset.get("reasoning_gym")) if isinstance(dataset, dict) else None
            if isinstance(rg, dict) and rg.get("name"):
                return {**data, "reward": "reasoning_gym"}
        return data

    @field_validator("reward")
    @classmethod
    def _registered_reward(cls, reward: str | list[RewardTerm]) -> str | list[RewardTerm]:
        if isinstance(reward, str):
            if len(reward) > 128:
                raise ValueError("task.reward: an entry point name has at most 128 characters")
            check_reward_name(reward)  # RewardNameError (a ValueError): names task.reward, the choices and the fix
        elif not 1 <= len(reward) <= 16:
            raise ValueError(f"task.reward: a weighted list needs 1 to 16 rewards, got {len(reward)}")
        return reward


class EvaluationSpec(SpecModel):
    """Validation during training: every K steps and after the last, the validation prompts are rolled out at the
    current weights (not trained on) and scored with task.reward: mean reward, pass@1, pass@k, response length."""

    every_steps: int = Field(
        0, ge=0, le=10**7, description="Evaluate after every K-th step and after the last one; 0 = never."
    )
    samples: int = Field(
        4,
        ge=1,
        le=MAX_GROUP_SIZE,
        description="k: responses sampled per validation prompt; pass@k is the unbiased estimator of the Codex "
        "paper over them (pass@1 too).",
    )
    prompts: int = Field(64, ge=1, le=100000, description="Validation prompts evaluated (the first N of the split).")
    temperature: float = Field(
        1.0, ge=0, le=10, description="Sampling temperature of the evaluation; 0 = greedy (then samples must be 1)."
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold of the evaluation; 1 = off.")
    max_new_tokens: int = Field(
        0, ge=0, le=MAX_NEW_TOKENS, description="Longest evaluation response in tokens; 0 = algorithm.maxNewTokens."
    )
    pass_threshold: float = Field(
        1.0,
        ge=-1000,
        le=1000,
        description="A response passes (counts for pass@k) when its reward is at least this (1.0: a verifier's "
        "full score; with a weighted reward, the main term's weight).",
    )
    seed: int = Field(0, ge=0, description="Base sampling seed of the evaluation rollouts.")

    @model_validator(mode="after")
    def _greedy_once(self) -> EvaluationSpec:
        if self.temperature == 0 and self.samples > 1:
            raise SpecFieldError(
                "samples",
                f"evaluation.temperature 0 is greedy: every one of evaluation.samples ({self.samples}) responses "
                "would be the same; set samples to 1 or a temperature above 0",
            )
        return self


class RolloutCorrectionSpec(SpecModel):
    """The correction of the gap between the policy the workers sampled from and the trainer's (algorithm
    .rolloutCorrection; TRL's vllm_importance_sampling_*, veRL's algorithm.rollout_correction). On: decoupled PPO,
    the ratio is taken against the trainer's own log-probs at the step's weights (the proximal policy) and each
    row that carries the workers' log-probs is weighted by w = pi_trainer / pi_worker (detached)."""

    mode: Literal["none", "tis", "mask"] = Field(
        "none",
        description="'none': no weight (stale rows take the workers' log-probs as the ratio's old policy); 'tis': "
        "truncated importance sampling, min(w, cap); 'mask': masked importance sampling, w where w <= cap, else 0.",
    )
    level: Literal["token", "sequence"] = Field(
        "token",
        description="'token': one w per token; 'sequence': one w per row, the product of its tokens' "
        "(exp of the summed log-ratio), applied to all of its tokens.",
    )
    cap: float = Field(
        2.0, ge=1.0, le=1e6, description="The bound on w: truncated at it ('tis') or masked above it ('mask')."
    )
    old_logprobs: Literal["workers", "trainer"] = Field(
        "workers",
        description="Mode 'none': where a stale row's old log-probs (the ratio's old policy) come from. 'workers': "
        "those the workers reported as they sampled (veRL's bypass mode); no extra pass, but their last bits depend on "
        "how each worker batched its requests, so such a run ends on other weights each time. 'trainer': the trainer "
        "scores the stale rows under the weights that sampled them (the bf16 weights it published one version before, "
        "kept on every rank as a frozen copy of the model): one more forward pass per micro-batch that has stale rows, "
        "and the run is bit-reproducible. 'trainer' needs algorithm.maxStaleness 1 (only that version is kept), no "
        "partialRollout and trainer.zeroStage 0-2.",
    )


class AlgorithmSpec(SpecModel):
    """GRPO-family policy optimisation."""

    name: Literal["grpo"] = Field("grpo", description="Policy-gradient algorithm.")
    steps: int = Field(60, ge=1, le=10**7, description="Optimizer steps to run.")
    prompts_per_step: int = Field(
        32, ge=1, le=10**6, description="Prompts per step (the batch); each gets group_size samples."
    )
    group_size: int = Field(
        8, ge=2, le=MAX_GROUP_SIZE, description="Samples per prompt; advantages are normalised within a group."
    )
    learning_rate: float = Field(2e-3, gt=0, le=1.0, description="Optimizer learning rate.")
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold; 1 = off.")
    max_new_tokens: int = Field(8, ge=1, le=MAX_NEW_TOKENS, description="Maximum response length in tokens.")
    clip_ratio: float = Field(0.2, gt=0, le=10, description="PPO-style clip range of the importance ratio.")
    clip_ratio_low: float = Field(
        0.0, ge=0, lt=1, description="Lower clip range: ratio >= 1 - clipRatioLow; 0 = clipRatio."
    )
    clip_ratio_high: float = Field(
        0.0, ge=0, le=10, description="Upper clip range: ratio <= 1 + clipRatioHigh (DAPO clip-higher); 0 = clipRatio."
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        le=100,
        description="Weight of the KL penalty to a frozen copy of the initial policy (algorithm.klEstimator; in the loss, or the reward with klInReward); 0 = no reference model.",
    )
    entropy_coef: float = Field(
        0.0, ge=0, le=100, description="Weight of the entropy bonus (subtracted from the loss); 0 = off."
    )
    loss_aggregation: Literal["sequence", "token", "token-mean"] = Field(
        "sequence",
        description="'sequence': token mean per sequence, then mean over sequences (GRPO); 'token': every token "
        "weighs the same, sum / (sequences x maxNewTokens) (Dr. GRPO); 'token-mean': sum / the step's response "
        "tokens (DAPO, TRL's default dapo, veRL's token-mean), normalised once per optimizer step.",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        le=1000,
        description="Accept samples generated up to this many weight versions behind the step's (importance-corrected with clipping); 0 = strictly on-policy. Older samples are skipped (no loss) and counted.",
    )
    partial_rollout: bool = Field(
        False,
        description="Partial rollout (APRIL / AReaL): a step's rollout ends once promptsPerStep groups are complete; "
        "unfinished responses are neither thrown away nor waited for but continue under the next weight version "
        "(their tokens' versions and behaviour log-probs recorded), counted against maxStaleness by their oldest "
        "token. With task.environment whole episodes are carried: their env-runners keep driving them and their "
        "later turns run under the next version. Needs maxStaleness >= 1.",
    )
    rollout_ahead: int = Field(
        0,
        ge=0,
        le=1,
        description="Steps the rollout runs ahead of training: 1 = step s+1's rollout starts, at weight version s, as "
        "soon as step s's has ended, so the workers generate while the trainer trains (one-step off-policy, as "
        "veRL's and AReaL's asynchronous modes; the samples are 1 version stale and importance-corrected); 0 = each "
        "step's rollout waits for the previous step's weights (on-policy). Needs maxStaleness >= 1; not with "
        "partialRollout or trainer.colocateReserved.",
    )
    partial_rollout_over_provision: float = Field(
        0.25,
        ge=0,
        le=4,
        description="With partialRollout: groups kept in flight per step beyond promptsPerStep, as a fraction of it "
        "(rounded up), so the step can stop at its target while the longest responses go on; 0 = none extra.",
    )
    max_turns: int = Field(
        8,
        ge=1,
        le=1000,
        description="Agentic episodes (task.environment): most model turns per episode; an episode still going "
        "after them ends (finish reason 'length').",
    )
    max_episode_tokens: int = Field(
        4096,
        ge=2,
        le=MAX_NEW_TOKENS,
        description="Agentic episodes: most tokens an episode may hold, its first prompt, the model's turns and the "
        "environment's messages together (the training sequence's length); reaching it ends the episode ('length').",
    )
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clipping.")
    micro_batch_size: int = Field(32, ge=1, le=65536, description="Trajectories per forward/backward micro-batch.")
    seed: int = Field(0, ge=0, description="Seed of the trainer and of every sample's sampling seed.")
    # The GRPO-family variants users bring from TRL and veRL (docs/algorithms.md maps each to their names).
    advantage_normalization: Literal["group", "batch", "none"] = Field(
        "group",
        description="'group': (r - group mean) / (group std + eps) (GRPO); 'batch': (r - group mean) / (the step's "
        "std + eps) (TRL scale_rewards=batch), the step trains once its whole batch is in; 'none': r - group mean "
        "(Dr. GRPO). Dropped, reward-failed and too-stale samples stay out of the means and stds (advantage 0).",
    )
    importance_ratio: Literal["token", "sequence"] = Field(
        "token",
        description="'token': one ratio per token (PPO, GRPO); 'sequence': one per row, exp of its mean token "
        "log-ratio (GSPO), clipped as a whole.",
    )
    dual_clip: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="Dual-clip PPO bound c (veRL clip_ratio_c): for a negative advantage the token loss is at most "
        "-A x c, so a stale token with a large ratio cannot blow the loss up; 0 = off, else > 1.",
    )
    rollout_correction: RolloutCorrectionSpec = Field(
        default_factory=RolloutCorrectionSpec,
        description="Correct the trainer/sampler gap (and staleness) by importance weights: decoupled PPO.",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="Estimator of the KL to the reference per token, with d = log pi - log pi_ref: 'k1' d, 'k2' "
        "d^2 / 2, 'k3' exp(-d) + d - 1 (Schulman).",
    )
    kl_in_reward: bool = Field(
        False,
        description="Put klCoef x the sample's summed KL into its reward before the advantages (veRL "
        "use_kl_in_reward) instead of into the loss; the step trains once its whole batch is in and scored.",
    )
    updates_per_step: int = Field(
        1,
        ge=1,
        le=64,
        description="Optimizer updates on each step's batch (TRL num_iterations, veRL ppo_epochs); the old "
        "log-probs of the ratio are those of the first pass, computed once. The step publishes once.",
    )

    @model_validator(mode="after")
    def _variants(self) -> AlgorithmSpec:
        if 0 < self.dual_clip <= 1:
            raise SpecFieldError(
                "dualClip",
                f"algorithm.dualClip ({self.dual_clip}) bounds the loss of a negative advantage at ratio c: it must "
                "be > 1 (veRL's default is 3), or 0 for off",
            )
        if self.kl_in_reward and self.kl_coef == 0:
            raise SpecFieldError(
                "klInReward",
                "algorithm.klInReward puts klCoef x KL into the reward: set algorithm.klCoef > 0 (or klInReward false)",
            )
        return self


class ResourcesSpec(SpecModel):
    """CPU and memory a pod's container asks the scheduler for (Kubernetes requests; unused locally)."""

    cpu: str = Field("500m", pattern=QUANTITY, description="CPU request, a Kubernetes quantity ('500m', '2').")
    memory: str = Field("1Gi", pattern=QUANTITY, description="Memory request, a Kubernetes quantity ('1Gi', '512Mi').")


class ServicePodSpec(ResourcesSpec, PodPolicy):
    """A service pod's requests and its pod policy (ServiceAccount, env, priority class, pod-template overlay)."""


class ServicesSpec(SpecModel):
    """Requests of the job's service pods on Kubernetes (the trainer's and workers' are with them)."""

    manager: ServicePodSpec = Field(
        default_factory=ServicePodSpec, description="The rollout-manager's requests and pod policy."
    )
    weight_server: ServicePodSpec = Field(
        default_factory=ServicePodSpec, description="The weight-server's requests and pod policy."
    )
    nats: ServicePodSpec = Field(
        default_factory=lambda: ServicePodSpec(cpu="100m", memory="128Mi"),
        description="The job's NATS's requests and pod policy.",
    )


class TrainerSpec(PodPolicy):
    """The DeepSpeed trainer (its pod policy: rlboost.pod_policy.PodPolicy)."""

    ranks: int = Field(1, ge=1, le=4096, description="Data-parallel ranks (a StatefulSet's replicas on Kubernetes).")
    zero_stage: int = Field(1, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto = nccl on GPU, gloo on CPU."
    )
    gpus_per_rank: int = Field(
        0,
        ge=0,
        le=16,
        description="Accelerators per rank (0 on CPU, else 1): a rank is one process on one accelerator, so a "
        "trainer on N GPUs is trainer.ranks N (one pod each); more than 1 is refused.",
    )
    checkpoint_every: int = Field(
        10,
        ge=1,
        le=10**7,
        description="Write a checkpoint every K steps (and after the last step) when the trainer has a checkpoint directory.",
    )
    keep_checkpoints: int = Field(
        3, ge=1, le=1000, description="Valid checkpoints kept; older ones are deleted after a new one is complete."
    )
    stream_training: bool = Field(
        True,
        description="Train micro-batches as soon as their groups finish, while the rest of the step's rollout runs; false = wait for the whole batch (for comparison).",
    )
    share_prompts: bool = Field(
        True,
        description="Compute each distinct prompt of a micro-batch once (a group's samples share theirs) and every response against its KV cache: the same loss to float rounding, with the prompt's FLOPs and logits out of every sample but one; false = every row's whole sequence, as TRL and veRL compute it (for comparison).",
    )
    colocate_reserved: bool = Field(
        False,
        description="Reserved rollout workers share the trainer's accelerators: they release engine memory (weights, KV cache) while the trainer trains and resume after each step.",
    )
    backoff_limit: int = Field(
        3,
        ge=0,
        le=1000,
        description="Trainer restarts tolerated on Kubernetes (the most any rank's container restarted after a failure); each restart resumes from the newest checkpoint. One more and the RLJob is Failed (reason BackoffLimitExceeded) and scaled to zero.",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Each rank's requests (Kubernetes).")

    @model_validator(mode="after")
    def _one_accelerator_per_rank(self) -> TrainerSpec:
        # A pod runs one trainer process (its rank is the pod's ordinal): N GPUs per pod would bill N and use one.
        if self.gpus_per_rank > 1:
            raise SpecFieldError(
                "gpusPerRank",
                f"trainer.gpusPerRank {self.gpus_per_rank}: a rank is one process on one accelerator (a pod runs one "
                f"rank), so the other {self.gpus_per_rank - 1} would be billed and idle; set gpusPerRank 1 and "
                f"multiply trainer.ranks by {self.gpus_per_rank} instead",
            )
        return self


MAX_TENSOR_PARALLEL = 8  # tensorParallel's bound: one node's accelerators


class PoolSpec(PodPolicy):
    """One pool of rollout workers (its pod policy: rlboost.pod_policy.PodPolicy)."""

    replicas: int = Field(
        1, ge=0, le=10000, description="Workers started (for spot: the initial count, bounded by min/max)."
    )
    min_replicas: int = Field(0, ge=0, le=10000, description="Lower bound of the worker count.")
    max_replicas: int = Field(16, ge=0, le=10000, description="Upper bound of the worker count.")
    capacity: int = Field(64, ge=1, le=MAX_WORKER_CAPACITY, description="Concurrent requests per worker.")
    engine: Literal["torch", "sglang"] = Field(
        "torch", description="Generation engine: 'torch' (CPU, tests) or 'sglang' (GPU)."
    )
    gpus_per_worker: int = Field(0, ge=0, le=16, description="Accelerators per worker (0 on CPU).")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Kubernetes nodeSelector of the pool's pods."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Each worker's requests (Kubernetes).")
    tensor_parallel: int = Field(
        1,
        ge=1,
        le=MAX_TENSOR_PARALLEL,
        description="Accelerators one engine shards the model over (SGLang's tp_size), e.g. 2 for wider engines "
        "that finish the long tail sooner; gpusPerWorker must be at least this. The 'torch' engine takes 1 only.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpec:
        if self.min_replicas > self.max_replicas:
            raise SpecFieldError(
                "minReplicas", f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})"
            )
        check_tensor_parallel(self.engine, self.tensor_parallel, self.gpus_per_worker)
        no_account_name(self)
        return self


def check_tensor_parallel(engine: str, tensor_parallel: int, gpus_per_worker: int, prefix: str = "") -> None:
    """A pool's or spot variant's tensorParallel against its engine and accelerators (`prefix`: the field path to
    the model that has tensorParallel and gpusPerWorker, e.g. 'variants.0.')."""
    if engine == "torch" and tensor_parallel > 1:
        raise SpecFieldError(
            f"{prefix}tensorParallel",
            f"engine torch requires tensorParallel 1 (got {tensor_parallel}); use engine 'sglang' for "
            "tensor-parallel engines",
        )
    if tensor_parallel > gpus_per_worker and tensor_parallel > 1:
        raise SpecFieldError(
            f"{prefix}gpusPerWorker",
            f"gpusPerWorker ({gpus_per_worker}) must be >= tensorParallel ({tensor_parallel}): one engine shards "
            "the model over that many accelerators of its worker",
        )


SpotWorkers = int | Mapping[str, int]  # the spot pool's workers: a total, or workers per variant name


class SpotVariantSpec(SpecModel):
    """One accelerator type of the spot pool at its own price (rollout.spot.variants): its own Deployment
    ({job}-workers-spot-{name}) on its own nodes; the engine, resources and the rest come from rollout.spot."""

    name: str = Field(
        min_length=1,
        max_length=20,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="The variant's name (lowercase letters, digits, '-'): suffixes its Deployment's name and "
        "labels its pods rlboost.io/spot-variant.",
    )
    accelerator: str = Field(
        "",
        max_length=63,
        pattern=r"^$|^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="The accelerator type, e.g. 'nvidia-l4' (labels the pods rlboost.io/accelerator, for "
        "dashboards); where the pods go is nodeSelector's business.",
    )
    price_per_gpu_hour: float = Field(
        ge=0,
        le=10000,
        description="USD per GPU-hour of this variant's spot accelerators: the status's cost (instead of "
        "prices.spotPerGpuHour) and the order the spot workers are split across the variants in.",
    )
    gpus_per_worker: int = Field(1, ge=0, le=16, description="Accelerators per worker of this variant (0 on CPU).")
    tensor_parallel: int = Field(
        1,
        ge=1,
        le=MAX_TENSOR_PARALLEL,
        description="Accelerators one engine shards the model over (SGLang's tp_size); at most gpusPerWorker.",
    )
    capacity: int = Field(
        64, ge=1, le=MAX_WORKER_CAPACITY, description="Concurrent requests per worker of this variant."
    )
    max_replicas: int = Field(16, ge=0, le=10000, description="Most workers of this variant.")
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Added to rollout.spot.nodeSelector for this variant's pods, e.g. "
        "{cloud.google.com/gke-accelerator: nvidia-l4}; give each variant nodes of its own.",
    )
    pod_template: PodTemplateOverlay = Field(
        default_factory=PodTemplateOverlay,
        description="A pod-template overlay for this variant's pods, merged after rollout.spot.podTemplate (e.g. "
        "its accelerator's tolerations or a larger /dev/shm).",
    )

    def price_per_slot(self) -> float:
        """USD per hour of one concurrent request: what the split ranks variants by (0 on CPU)."""
        return self.price_per_gpu_hour * self.gpus_per_worker / self.capacity


def split_spot_workers(
    total: int, variants: Sequence[SpotVariantSpec], available: Mapping[str, int] | None = None
) -> dict[str, int]:
    """`total` spot workers across the variants. Cheapest per request slot first (pricePerGpuHour x gpusPerWorker
    / capacity; a tie goes to the variant listed first), each filled up to the lower of its maxReplicas and, when
    `available` is given, the workers its nodes hold now; what is left after that goes, in the same order, up to
    each maxReplicas (pods that wait for nodes). More than every maxReplicas together is not asked for."""
    order = sorted(range(len(variants)), key=lambda i: (variants[i].price_per_slot(), i))
    out = {v.name: 0 for v in variants}
    left = total
    for bounded in (available is not None, False):
        for i in order:
            v = variants[i]
            room = (
                min(v.max_replicas, available.get(v.name, 0)) if bounded and available is not None else v.max_replicas
            )
            take = max(0, min(left, room - out[v.name]))
            out[v.name] += take
            left -= take
    return out


class SpotPoolSpec(PoolSpec):
    """The pool of spot (preemptible) rollout workers."""

    sizing: Literal["default", "autoscaler", "capacity", "busy"] = Field(
        "default",
        description="How the operator sizes the pool. 'autoscaler': spot nodes are provisioned on demand (GKE node "
        "auto-provisioning, cluster-autoscaler, Karpenter): ask for maxReplicas, fewer while pods stay unschedulable, "
        "then retry. 'capacity': as many as the spot nodes present hold. 'busy': at most what the spot nodes present "
        "hold, and only as many as the step reports keep busy (shrinks while spot idles, grows while the trainer waits "
        "for rollout and spot is busy, at spec.prices; rlboost.policies.spot_scaling.BusySpotScaler). 'default': the "
        "operator's setting (the chart's jobDefaults.spot.sizing).",
    )
    variants: list[SpotVariantSpec] = Field(
        default_factory=list,
        max_length=16,
        description="Accelerator types of the spot pool, each with its own price, nodes and Deployment (e.g. L4 "
        "and A10G spot beside H100 reserved). The operator sizes the pool as a whole (min/maxReplicas, sizing) and "
        "splits the workers cheapest per request slot first (pricePerGpuHour x gpusPerWorker / capacity), each "
        "variant up to its maxReplicas and the workers its nodes hold; the status's cost counts each at its price. "
        "Empty: one spot Deployment with this pool's own gpusPerWorker, capacity and nodeSelector at "
        "prices.spotPerGpuHour.",
    )

    @model_validator(mode="after")
    def _variants(self) -> SpotPoolSpec:
        names = [v.name for v in self.variants]
        for i, v in enumerate(self.variants):
            if v.name in names[:i]:
                raise SpecFieldError(f"variants.{i}.name", f"variant name {v.name!r} is used twice; name each once")
            check_tensor_parallel(self.engine, v.tensor_parallel, v.gpus_per_worker, f"variants.{i}.")
        most = sum(v.max_replicas for v in self.variants)
        if self.variants and self.min_replicas > most:
            raise SpecFieldError(
                "minReplicas",
                f"minReplicas ({self.min_replicas}) exceeds the variants' maxReplicas together ({most}); lower it "
                "or raise a variant's maxReplicas",
            )
        return self

    def variant(self, name: str) -> SpotVariantSpec:
        """The variant called `name` (KeyError naming the choices otherwise)."""
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(f"no spot variant {name!r}; rollout.spot.variants names {[v.name for v in self.variants]}")

    def variant_pool(self, name: str) -> PoolSpec:
        """The pool one variant's workers are: this pool with the variant's accelerators, capacity, bound and
        nodeSelector (added to the pool's), for what reads a PoolSpec (scheduling, capacity, the worker)."""
        v = self.variant(name)
        return PoolSpec(
            replicas=0,
            min_replicas=0,
            max_replicas=v.max_replicas,
            capacity=v.capacity,
            engine=self.engine,
            gpus_per_worker=v.gpus_per_worker,
            tensor_parallel=v.tensor_parallel,
            node_selector={**self.node_selector, **v.node_selector},
            resources=self.resources,
            **{name: getattr(self, name) for name in PodPolicy.model_fields},  # the pool's (the variant's overlay
            # goes on after the pool's: rlboost_operator.children.policy)
        )

    def per_variant(self, spot_workers: SpotWorkers) -> dict[str, int]:
        """Spot workers per variant: a mapping as given, a total split as the operator splits it (no node bound)."""
        if isinstance(spot_workers, int):
            return split_spot_workers(spot_workers, self.variants)
        return {v.name: int(spot_workers.get(v.name, 0)) for v in self.variants}


class EnvRunnersSpec(PodPolicy):
    """The env-runner pool (agentic episodes): CPU processes that run the environments and drive the episodes; on
    Kubernetes a Deployment, spot nodes allowed (an env-runner lost restarts its episodes from their tasks). Its pod
    policy: rlboost.pod_policy.PodPolicy."""

    replicas: int = Field(2, ge=1, le=10000, description="Env-runners (a Deployment's replicas on Kubernetes).")
    capacity: int = Field(
        16,
        ge=1,
        le=100000,
        description="Episodes one env-runner drives at once (one confined environment process each).",
    )
    spot: Literal["allowed", "required", "never"] = Field(
        "allowed",
        description="Kubernetes: 'allowed' tolerates spot nodes and prefers them, 'required' puts the pods on spot "
        "nodes only, 'never' keeps them off.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=32, description="Kubernetes nodeSelector of the env-runner pods."
    )
    resources: ResourcesSpec = Field(
        default_factory=lambda: ResourcesSpec(cpu="2", memory="4Gi"), description="Each env-runner's requests."
    )


class RolloutSpec(SpecModel):
    """Rollout workers and the manager's timing."""

    env_runners: EnvRunnersSpec = Field(
        default_factory=EnvRunnersSpec,
        description="The env-runner pool that drives agentic episodes (only started when task.environment is set).",
    )

    reserved: PoolSpec = Field(
        default_factory=lambda: PoolSpec(replicas=1), description="Reserved (on-demand) workers."
    )
    spot: SpotPoolSpec = Field(
        default_factory=lambda: SpotPoolSpec(replicas=2), description="Preemptible (spot) workers."
    )
    heartbeat_interval_ms: int = Field(500, ge=50, le=60000, description="Worker heartbeat period.")
    lease_timeout_ms: int = Field(5000, ge=200, le=600000, description="A worker silent this long loses its requests.")
    chunk_max_tokens: int = Field(16, ge=1, le=4096, description="A token chunk is sent after this many tokens...")
    offload_window_s: float = Field(
        0.0,
        ge=0,
        le=3600,
        description="Initial adaptive offload window in seconds: reserved workers' partial responses still running after it move to spot workers (0 = never offload).",
    )
    chunk_max_ms: int = Field(50, ge=1, le=10000, description="...or after this many milliseconds, whichever first.")
    max_prompt_tokens: int = Field(
        8192,
        ge=1,
        le=131072,
        description="Longest prompt in tokens the rollout-manager accepts in a step; a longer one fails the step's "
        "Rollout call with an error naming the prompt.",
    )
    max_step_requests: int = Field(
        65536,
        ge=1,
        le=1 << 20,
        description="Most requests (prompts x groupSize) one step's Rollout call may ask the rollout-manager for; "
        "algorithm.promptsPerStep x algorithm.groupSize must not exceed it.",
    )
    max_request_attempts: int = Field(
        5,
        ge=1,
        le=1000,
        description="Failed attempts a request gets before it is reported failed: its worker's stream broke, its lease "
        "expired, it stalled (requestStallTimeoutMs), its worker sent invalid output (a token id outside the "
        "vocabulary, a non-finite or positive log-probability) or reported it failed. Planned moves (drain, "
        "rebalance, offload) do not count.",
    )
    on_failed_request: Literal["fail", "drop"] = Field(
        "fail",
        description="What a request reported failed does to its step: 'fail' ends the step's Rollout call with an "
        "error naming the request; 'drop' delivers it as a trajectory with finishReason 'failed', which the trainer "
        "trains with zero weight (and counts).",
    )
    request_stall_timeout_ms: int = Field(
        120000,
        ge=1000,
        le=3600000,
        description="A running request that receives no token for this long is revoked and migrated (a failed "
        "attempt), even if its worker still heartbeats.",
    )
    step_deadline_s: float = Field(
        0.0,
        ge=0,
        le=86400,
        description="Seconds a step's rollout may take (0 = no deadline); past it the trainer reports which samples "
        "are missing and retries the step's rollout (stepRetries) or fails.",
    )
    step_retries: int = Field(
        0,
        ge=0,
        le=100,
        description="Times the trainer asks again for a step's rollout after its deadline passed (stepDeadlineS); "
        "once they are spent the next deadline fails the job with the missing samples named.",
    )
    speed_rebalance_migration_cost_s: float = Field(
        2.0,
        ge=0,
        le=3600,
        description="Seconds the rollout-manager expects moving one running response to a faster worker to cost "
        "(revoke, flush, re-assign, re-prefill of prompt and generated tokens): a response moves at a step's tail "
        "only when the faster worker would finish it sooner by more than this. Larger = fewer moves.",
    )
    speed_rebalance_max_moves: int = Field(
        16,
        ge=0,
        le=100000,
        description="Most responses one balancing pass moves off slow workers to faster idle ones at a step's tail "
        "(the next pass, a balance interval later, may move more); 0 = no speed rebalance.",
    )
    max_chunk_messages_per_s: int = Field(
        2000,
        ge=0,
        le=10_000_000,
        description="Load-adaptive chunk cadence: the ChunkBatch messages per second the rollout-manager wants from "
        "all its workers together (their periodic flushes; a request's end still flushes at once). It stretches "
        "every worker's flush period to workers x 1000 / this ms (never below chunkMaxMs, at most 1000 ms and a "
        "fifth of leaseTimeoutMs; re-announced when it moves by more than 25%) and chunkMaxTokens by the same "
        "factor, so its CPU per token stays low at 1,000 workers (2000: 0.5 s at 1,000 workers). Costs: tokens "
        "reach the manager up to that period later, and what a worker had not flushed when it dies is generated "
        "again (a drain flushes first). Below 100 workers (at 2000) nothing stretches. 0 = the fixed chunkMaxTokens / chunkMaxMs.",
    )


class WeightSyncSpec(SpecModel):
    """How weights travel from trainer to workers."""

    mode: Literal["delta", "full"] = Field(
        "delta", description="'delta': sparse bit-exact deltas; 'full': a snapshot per version."
    )
    full_every: int = Field(10, ge=1, le=100000, description="A full snapshot every K versions bounds the delta chain.")
    chunk_bytes: int = Field(4 << 20, ge=4096, le=1 << 30, description="Payload chunk size served with HTTP Range.")
    streams: int = Field(4, ge=1, le=64, description="Concurrent ranged HTTP streams per pull.")
    retain_versions: int = Field(20, ge=1, le=100000, description="Versions kept on the weight-server.")


class PricesSpec(SpecModel):
    """Prices per accelerator-hour, for cost and cost-efficiency status."""

    reserved_per_gpu_hour: float = Field(10.47, ge=0, description="USD per reserved GPU-hour.")
    spot_per_gpu_hour: float = Field(2.66, ge=0, description="USD per spot GPU-hour.")


class RetentionSpec(SpecModel):
    """What outlives the RLJob on Kubernetes."""

    pvcs: Literal["Retain", "Delete"] = Field(
        "Retain",
        description="The trainer's checkpoint PVCs and the weight-server's PVC when the RLJob is deleted. 'Retain' (default, like a StatefulSet's): a deleted job's checkpoints survive an accidental delete, and an RLJob created again under the same name resumes from them (delete the PVCs, label rlboost.io/job=NAME, to start over). 'Delete': they go with the RLJob.",
    )


class LoggingSpec(SpecModel):
    """Where the trainer sends each step's metrics (rlboost.tracking): every numeric field of the step report."""

    backends: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["jsonl"],
        max_length=4,
        description="Tracking backends: 'jsonl' (metrics.jsonl in `dir`), 'tensorboard' (event files in "
        "`dir`/tensorboard), 'wandb' (a run in `dir`/wandb; WANDB_MODE=offline works without network, WANDB_API_KEY "
        "and WANDB_PROJECT from the environment otherwise), 'mlflow' (`mlflowTrackingUri`, default a file store in "
        "`dir`/mlruns). wandb and mlflow need their library in the trainer's image (pip install 'rlboost[tracking]').",
    )
    dir: str = Field(
        "",
        max_length=4096,
        description="Directory of the local backends' files; empty = 'tracking' in the trainer's run directory, a "
        "relative path is relative to it.",
    )
    run_name: str = Field("", max_length=256, description="Run name shown by W&B and MLflow; empty = the job's name.")
    project: str = Field(
        "rlboost",
        min_length=1,
        max_length=256,
        description="W&B project and MLflow experiment the run is logged under.",
    )
    mlflow_tracking_uri: str = Field(
        "",
        max_length=4096,
        pattern=r"^$|^(file:|sqlite:|https?://)",
        description="MLflow tracking server ('http://host:5000', checked before the first step), file store "
        "('file:/path') or database ('sqlite:///path'); empty = a file store in `dir`/mlruns.",
    )

    @field_validator("backends")
    @classmethod
    def _distinct(cls, backends: list[str]) -> list[str]:
        repeated = sorted({b for b in backends if backends.count(b) > 1})
        if repeated:
            raise ValueError(f"logging.backends names {', '.join(repeated)} twice; list each backend once")
        return backends


class ExportSpec(SpecModel):
    """The trained policy written as a Hugging Face model directory (rlboost.export)."""

    path: str = Field(
        "",
        max_length=4096,
        description="Where the trainer writes the policy as a Hugging Face model directory (safetensors, config.json, "
        "tokenizer, generation_config.json) that transformers and SGLang load as is: a directory (a PVC mount on "
        "Kubernetes; a relative path is relative to the trainer's run directory) or 's3://bucket/prefix' / "
        "'gs://bucket/prefix'. Empty = no export.",
    )
    every_checkpoints: int = Field(
        0,
        ge=0,
        le=10**6,
        description="Also export at every N-th checkpoint (every N x trainer.checkpointEvery steps, with or without a "
        "checkpoint directory), beside `path` as `path`-step-<steps done, 8 digits>; 0 = only at the end of training.",
    )

    @model_validator(mode="after")
    def _path_for_every(self) -> ExportSpec:
        if self.every_checkpoints and not self.path:
            raise SpecFieldError("everyCheckpoints", "export.everyCheckpoints needs export.path: set where to write")
        if "://" in self.path and not self.path.startswith(URI_SCHEMES):
            raise SpecFieldError(
                "path", f"export.path {self.path!r}: use a directory, s3://bucket/prefix or gs://bucket/prefix"
            )
        return self


MAX_BUDGET_USD = 1e9  # spec.budget's bound
_BUDGET_SCHEMA = {
    "type": "number",
    "nullable": True,
    "exclusiveMinimum": 0,
    "maximum": MAX_BUDGET_USD,
    "description": "USD this job may spend (status.costSoFar at spec.prices); past it the RLJob gets the condition "
    "BudgetExceeded and the RLBoostBudgetExceeded alert fires (the job keeps running: suspend it to stop). Unset: "
    "no budget.",
}


class JobSpec(SpecModel):
    """An RL post-training job: the RLJob custom resource's spec."""

    model: ModelSpec = Field(default_factory=ModelSpec, description="Policy model.")
    task: TaskSpec = Field(default_factory=TaskSpec, description="Task and reward.")
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec, description="Algorithm and its hyper-parameters.")
    trainer: TrainerSpec = Field(default_factory=TrainerSpec, description="Trainer ranks and DeepSpeed.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rollout pools and manager timing.")
    weight_sync: WeightSyncSpec = Field(
        default_factory=WeightSyncSpec, description="Weight sync from trainer to workers."
    )
    prices: PricesSpec = Field(default_factory=PricesSpec, description="Accelerator prices.")
    retention: RetentionSpec = Field(
        default_factory=RetentionSpec, description="What outlives the RLJob when it is deleted (Kubernetes)."
    )
    services: ServicesSpec = Field(
        default_factory=ServicesSpec, description="Requests of the manager, weight-server and NATS pods (Kubernetes)."
    )
    logging: LoggingSpec = Field(default_factory=LoggingSpec, description="Metrics tracking backends.")
    export: ExportSpec = Field(
        default_factory=ExportSpec, description="Export of the trained policy as a Hugging Face model directory."
    )
    evaluation: EvaluationSpec = Field(
        default_factory=EvaluationSpec, description="Validation every K steps: mean reward, pass@1, pass@k."
    )
    # --- On a shared cluster (issue 30): pausing the job, and what it may spend -------------------------------
    suspend: bool = Field(
        False,
        description="true: the trainer checkpoints at the end of the step in progress, then every child is scaled "
        "to zero (status phase Suspended; checkpoints and the weight-server's versions are kept); false again "
        "resumes from that checkpoint bit-exactly. Kueue's admission suspends and resumes a queued job the same way.",
    )
    budget: Annotated[float | None, WithJsonSchema(_BUDGET_SCHEMA)] = Field(
        None,
        gt=0,
        le=MAX_BUDGET_USD,
        allow_inf_nan=False,
        description=_BUDGET_SCHEMA["description"],
    )

    def spot_accelerators(self, spot_workers: SpotWorkers) -> list[tuple[int, float]]:
        """(accelerators, USD per GPU-hour) of the spot workers: one entry per variant, or one for a pool without.
        `spot_workers`: workers per variant name, or a total (split as the operator splits it, with variants)."""
        spot = self.rollout.spot
        if not spot.variants:
            n = spot_workers if isinstance(spot_workers, int) else sum(spot_workers.values())
            return [(n * spot.gpus_per_worker, self.prices.spot_per_gpu_hour)]
        counts = spot.per_variant(spot_workers)
        return [(counts[v.name] * v.gpus_per_worker, v.price_per_gpu_hour) for v in spot.variants]

    def accelerators(self, reserved_workers: int, spot_workers: SpotWorkers) -> tuple[int, int]:
        """(reserved, spot) accelerators in use: the trainer's and the reserved workers' at the reserved price."""
        reserved = self.trainer.ranks * self.trainer.gpus_per_rank
        reserved += reserved_workers * self.rollout.reserved.gpus_per_worker
        return reserved, sum(gpus for gpus, _ in self.spot_accelerators(spot_workers))

    def cost_per_hour(self, reserved_workers: int, spot_workers: SpotWorkers) -> float:
        """USD per hour at spec.prices (each spot variant at its own price) for those workers: the one formula of
        the operator, trainer and scaler."""
        reserved, _ = self.accelerators(reserved_workers, 0)
        spot = sum(gpus * price for gpus, price in self.spot_accelerators(spot_workers))
        return reserved * self.prices.reserved_per_gpu_hour + spot

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        alg, tr = self.algorithm, self.trainer
        batch = alg.prompts_per_step * alg.group_size
        if batch % tr.ranks:
            raise SpecFieldError(
                "trainer.ranks",
                f"algorithm.promptsPerStep x algorithm.groupSize ({batch}) must be divisible by trainer.ranks ({tr.ranks})",
            )
        if batch > self.rollout.max_step_requests:
            raise SpecFieldError(
                "rollout.maxStepRequests",
                f"algorithm.promptsPerStep x algorithm.groupSize ({batch}) exceeds rollout.maxStepRequests "
                f"({self.rollout.max_step_requests}); raise it or ask for fewer samples per step",
            )
        per_rank = batch // tr.ranks
        if per_rank % effective_micro_batch(self):
            raise SpecFieldError(
                "algorithm.microBatchSize",
                f"algorithm.microBatchSize ({alg.micro_batch_size}) must divide the per-rank batch "
                f"(promptsPerStep x groupSize / trainer.ranks = {per_rank}) so every rank trains the same number "
                f"of micro-batches; pick a divisor of {per_rank}",
            )
        if alg.partial_rollout:
            self._check_partial_rollout()
        if alg.rollout_ahead:
            self._check_rollout_ahead()
        if alg.rollout_correction.old_logprobs == "trainer":
            self._check_old_logprobs()
        if self.task.episodes:
            self._check_episodes()
        evaluation = self.evaluation
        if evaluation.every_steps and evaluation.prompts * evaluation.samples > self.rollout.max_step_requests:
            raise SpecFieldError(
                "evaluation.prompts",
                f"evaluation.prompts x evaluation.samples ({evaluation.prompts * evaluation.samples}) exceeds "
                f"rollout.maxStepRequests ({self.rollout.max_step_requests}); evaluate fewer prompts or samples",
            )
        if tr.colocate_reserved and self.rollout.reserved.replicas != tr.ranks:
            raise SpecFieldError(
                "rollout.reserved.replicas",
                f"trainer.colocateReserved: one reserved rollout worker shares each trainer rank's accelerators, so "
                f"rollout.reserved.replicas ({self.rollout.reserved.replicas}) must equal trainer.ranks ({tr.ranks})",
            )
        data = self.task.active_dataset
        if data is not None and data.max_prompt_tokens > self.rollout.max_prompt_tokens:
            raise SpecFieldError(
                "task.dataset.maxPromptTokens",
                f"task.dataset.maxPromptTokens ({data.max_prompt_tokens}) exceeds rollout.maxPromptTokens "
                f"({self.rollout.max_prompt_tokens}), which the rollout-manager enforces; lower it or raise the latter",
            )
        if tr.backend == "nccl" and tr.gpus_per_rank == 0:
            raise SpecFieldError(
                "trainer.backend",
                "trainer.backend 'nccl' needs GPUs: set trainer.gpusPerRank >= 1 or use 'gloo'/'auto'",
            )
        self._check_has_workers()
        return self

    def _check_has_workers(self) -> None:
        """A job with no rollout worker at all would wait forever for its first step (issue 31)."""
        if self.rollout.reserved.replicas == 0 and self.rollout.spot.max_replicas == 0:
            raise SpecFieldError(
                "rollout.reserved.replicas",
                "rollout.reserved.replicas and rollout.spot.maxReplicas are both 0: the job would have no rollout "
                "worker; set rollout.reserved.replicas >= 1 or rollout.spot.maxReplicas >= 1",
            )

    def _check_rollout_ahead(self) -> None:
        """algorithm.rolloutAhead: a step trains on samples of the version before its own."""
        alg, why = self.algorithm, ""
        if alg.max_staleness < 1:
            why = "its samples are one weight version behind the step that trains on them: set algorithm.maxStaleness >= 1"
        elif alg.partial_rollout:
            why = "partialRollout already carries responses across steps: use one of the two"
        elif self.trainer.colocate_reserved:
            why = "colocated reserved workers give up their accelerators while the trainer trains: turn one of the two off"
        if why:
            raise SpecFieldError("algorithm.rolloutAhead", f"algorithm.rolloutAhead {alg.rollout_ahead}: {why}")

    def _check_old_logprobs(self) -> None:
        """rolloutCorrection.oldLogprobs 'trainer': every stale row is one version behind, the one the trainer keeps."""
        alg, why = self.algorithm, ""
        if alg.rollout_correction.mode != "none":
            why = (
                f"mode '{alg.rollout_correction.mode}' takes the trainer's own log-probs as the old policy already and "
                "weighs each row by the workers'; set oldLogprobs 'workers' or mode 'none'"
            )
        elif alg.max_staleness != 1:
            why = (
                f"the trainer keeps the weights of one version before, so stale rows must be one version behind: "
                f"set algorithm.maxStaleness 1 (it is {alg.max_staleness})"
            )
        elif alg.partial_rollout:
            why = "partialRollout continues a response under the next version, so one row may hold two versions' tokens: use 'workers'"
        elif self.trainer.zero_stage == 3:
            why = "ZeRO-3 partitions the weights the frozen copy is made from: set trainer.zeroStage 0, 1 or 2"
        if why:
            raise SpecFieldError("algorithm.rolloutCorrection.oldLogprobs", f"oldLogprobs 'trainer': {why}")

    def _check_partial_rollout(self) -> None:
        """algorithm.partialRollout: responses continue across versions, so a bound on their age is needed. Any
        trainer.ranks works: a step's last round of micro-batches, short when the complete groups do not fill it, is
        completed with weightless rows (trainer.ranks.complete_round)."""
        alg = self.algorithm
        if alg.max_staleness < 1:
            raise SpecFieldError(
                "algorithm.partialRollout",
                "algorithm.partialRollout continues unfinished responses under the next weight version, so their "
                "oldest tokens lag at least one version: set algorithm.maxStaleness >= 1 (or turn partialRollout off)",
            )
        groups = self.partial_rollout_groups()
        if not fits_step_limit(groups, alg.group_size, self.rollout.max_step_requests):
            raise SpecFieldError(
                "algorithm.partialRolloutOverProvision",
                f"{groups} groups in flight x algorithm.groupSize exceeds rollout.maxStepRequests "
                f"({self.rollout.max_step_requests}); lower the over-provision or raise the limit",
            )

    def _check_episodes(self) -> None:
        """task.environment: a model turn fits an episode, and the episode's tokens fit what the manager takes."""
        alg = self.algorithm
        if alg.max_new_tokens >= alg.max_episode_tokens:
            raise SpecFieldError(
                "algorithm.maxEpisodeTokens",
                f"algorithm.maxEpisodeTokens ({alg.max_episode_tokens}) must exceed algorithm.maxNewTokens "
                f"({alg.max_new_tokens}), one turn's budget, so that a turn fits the episode with its prompt",
            )
        if alg.max_episode_tokens > self.rollout.max_prompt_tokens + alg.max_new_tokens:
            raise SpecFieldError(
                "algorithm.maxEpisodeTokens",
                f"algorithm.maxEpisodeTokens ({alg.max_episode_tokens}) exceeds rollout.maxPromptTokens "
                f"({self.rollout.max_prompt_tokens}) + algorithm.maxNewTokens: a late turn's prompt (the episode so "
                "far) would be refused by the rollout-manager; lower it or raise rollout.maxPromptTokens",
            )

    def max_trained_tokens(self) -> int:
        """The most tokens one sample trains on: maxNewTokens, or an episode's model turns together (the
        normaliser of lossAggregation 'token')."""
        alg = self.algorithm
        if not self.task.episodes:
            return alg.max_new_tokens
        return min(alg.max_turns * alg.max_new_tokens, alg.max_episode_tokens)

    def partial_rollout_groups(self) -> int:
        """Groups in flight per step with algorithm.partialRollout: promptsPerStep plus the over-provision."""
        alg = self.algorithm
        return in_flight(alg.prompts_per_step, alg.partial_rollout_over_provision)


def effective_micro_batch(spec: JobSpec) -> int:
    """The micro-batch size actually used: `microBatchSize`, capped at one rank's share of the batch."""
    per_rank = spec.algorithm.prompts_per_step * spec.algorithm.group_size // spec.trainer.ranks
    return max(1, min(spec.algorithm.micro_batch_size, per_rank))


class SpecProblem(NamedTuple):
    """One thing wrong with a job spec: where (a dotted camelCase path, '' for the spec as a whole) and why."""

    path: str
    message: str


class JobSpecError(ValueError):
    """A job spec that cannot be used; the message names the field and the fix, `problems` lists them as data."""

    def __init__(self, message: str, problems: Sequence[SpecProblem] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


def spec_problems(err: ValidationError) -> list[SpecProblem]:
    """Each validation error as (field path, message); a SpecFieldError adds the field it names to the path."""
    problems = []
    for e in err.errors():
        path = [str(p) for p in e["loc"] if p not in (_REWARD_NAME, _REWARD_LIST)]
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, SpecFieldError):
            problems.append(SpecProblem(".".join([*path, cause.path]), str(cause)))
        elif isinstance(cause, ValueError):  # a field validator's own message, without pydantic's "Value error, "
            problems.append(SpecProblem(".".join(path), str(cause)))
        else:
            problems.append(SpecProblem(".".join(path), e["msg"]))
    return problems


def _spec_error(err: ValidationError, source: str) -> JobSpecError:
    problems = spec_problems(err)
    lines = [f"invalid job spec in {source}:", *(f"  {p.path or '(root)'}: {p.message}" for p in problems)]
    return JobSpecError("\n".join(lines), problems)


def parse_job_spec(data: object, source: str = "<dict>") -> JobSpec:
    """Validate a mapping (e.g. an RLJob's spec) into a JobSpec, or raise JobSpecError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise JobSpecError(
            f"invalid job spec in {source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise _spec_error(err, source) from None


def load_job_spec(path: str | Path) -> JobSpec:
    """Load a job spec from YAML. Accepts a bare spec or a whole RLJob manifest (uses `.spec`)."""
    path = Path(path)
    try:
        data = load_yaml_file(path)
    except ConfigFileError as err:
        raise JobSpecError(str(err)) from None
    if isinstance(data, dict) and data.get("kind") == "RLJob":
        data = data.get("spec")
    return parse_job_spec(data, str(path))


# libyaml's emitter where PyYAML has it (the same text, ~15x faster: the operator dumps the job file on every
# reconcile, and each component's pod policy made it twice as long)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_job_spec(spec: JobSpec) -> str:
    """YAML with camelCase keys, as a user would write it."""
    return yaml.dump(spec.model_dump(by_alias=True, mode="json"), Dumper=_DUMPER, sort_keys=False)
