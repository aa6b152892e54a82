from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Pool(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOL_UNSPECIFIED: _ClassVar[Pool]
    POOL_RESERVED: _ClassVar[Pool]
    POOL_SPOT: _ClassVar[Pool]
POOL_UNSPECIFIED: Pool
POOL_RESERVED: Pool
POOL_SPOT: Pool

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_new_tokens", "seed", "stop_token_ids")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("register", "chunks", "heartbeat", "drain", "weight_version")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    register: Register
    chunks: ChunkBatch
    heartbeat: Heartbeat
    drain: DrainNotice
    weight_version: WeightVersionReport
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., chunks: _Optional[_Union[ChunkBatch, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., drain: _Optional[_Union[DrainNotice, _Mapping]] = ..., weight_version: _Optional[_Union[WeightVersionReport, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("worker_id", "pool", "node", "capacity", "weight_version", "engine", "session_token", "held", "identity_proof")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_PROOF_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    pool: Pool
    node: str
    capacity: int
    weight_version: int
    engine: str
    session_token: str
    held: _containers.RepeatedCompositeFieldContainer[HeldResponse]
    identity_proof: str
    def __init__(self, worker_id: _Optional[str] = ..., pool: _Optional[_Union[Pool, str]] = ..., node: _Optional[str] = ..., capacity: _Optional[int] = ..., weight_version: _Optional[int] = ..., engine: _Optional[str] = ..., session_token: _Optional[str] = ..., held: _Optional[_Iterable[_Union[HeldResponse, _Mapping]]] = ..., identity_proof: _Optional[str] = ...) -> None: ...

class HeldResponse(_message.Message):
    __slots__ = ("request_id", "weight_version", "prompt_ids", "token_ids", "logprobs", "finished", "finish_reason", "ticket", "lease_epoch")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    LEASE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    weight_version: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finished: bool
    finish_reason: str
    ticket: str
    lease_epoch: int
    def __init__(self, request_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., ticket: _Optional[str] = ..., lease_epoch: _Optional[int] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("request_id", "lease_epoch", "offset", "token_ids", "logprobs", "finished", "finish_reason", "error", "invalid_input", "token_ids_packed", "logprobs_packed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INVALID_INPUT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_PACKED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_epoch: int
    offset: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finished: bool
    finish_reason: str
    error: str
    invalid_input: bool
    token_ids_packed: bytes
    logprobs_packed: bytes
    def __init__(self, request_id: _Optional[str] = ..., lease_epoch: _Optional[int] = ..., offset: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., error: _Optional[str] = ..., invalid_input: _Optional[bool] = ..., token_ids_packed: _Optional[bytes] = ..., logprobs_packed: _Optional[bytes] = ...) -> None: ...

class ChunkBatch(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[TokenChunk]
    def __init__(self, chunks: _Optional[_Iterable[_Union[TokenChunk, _Mapping]]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("weight_version", "running", "memory_released")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    MEMORY_RELEASED_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    running: int
    memory_released: bool
    def __init__(self, weight_version: _Optional[int] = ..., running: _Optional[int] = ..., memory_released: _Optional[bool] = ...) -> None: ...

class DrainNotice(_message.Message):
    __slots__ = ("reason", "deadline_ms")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    deadline_ms: int
    def __init__(self, reason: _Optional[str] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class WeightVersionReport(_message.Message):
    __slots__ = ("weight_version", "checksum")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    checksum: str
    def __init__(self, weight_version: _Optional[int] = ..., checksum: _Optional[str] = ...) -> None: ...

class ManagerMessage(_message.Message):
    __slots__ = ("registered", "assign", "revoke", "drain", "set_weight_version", "chunk_cadence")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    REVOKE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    SET_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CADENCE_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    assign: AssignBatch
    revoke: Revoke
    drain: DrainCommand
    set_weight_version: SetWeightVersion
    chunk_cadence: ChunkCadence
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., assign: _Optional[_Union[AssignBatch, _Mapping]] = ..., revoke: _Optional[_Union[Revoke, _Mapping]] = ..., drain: _Optional[_Union[DrainCommand, _Mapping]] = ..., set_weight_version: _Optional[_Union[SetWeightVersion, _Mapping]] = ..., chunk_cadence: _Optional[_Union[ChunkCadence, _Mapping]] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("heartbeat_interval_ms", "lease_timeout_ms", "chunk_max_tokens", "chunk_max_ms", "session_token", "packed_tokens", "colocation_ack_key")
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PACKED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COLOCATION_ACK_KEY_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_ms: int
    lease_timeout_ms: int
    chunk_max_tokens: int
    chunk_max_ms: int
    session_token: str
    packed_tokens: bool
    colocation_ack_key: str
    def __init__(self, heartbeat_interval_ms: _Optional[int] = ..., lease_timeout_ms: _Optional[int] = ..., chunk_max_tokens: _Optional[int] = ..., chunk_max_ms: _Optional[int] = ..., session_token: _Optional[str] = ..., packed_tokens: _Optional[bool] = ..., colocation_ack_key: _Optional[str] = ...) -> None: ...

class ChunkCadence(_message.Message):
    __slots__ = ("chunk_max_tokens", "chunk_max_ms")
    CHUNK_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_MAX_MS_FIELD_NUMBER: _ClassVar[int]
    chunk_max_tokens: int
    chunk_max_ms: int
    def __init__(self, chunk_max_tokens: _Optional[int] = ..., chunk_max_ms: _Optional[int] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("request_id", "lease_epoch", "input_ids", "prompt_len", "sampling", "weight_version", "prior_logprobs", "ticket")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PRIOR_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_epoch: int
    input_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_len: int
    sampling: SamplingParams
    weight_version: int
    prior_logprobs: _containers.RepeatedScalarFieldContainer[float]
    ticket: str
    def __init__(self, request_id: _Optional[str] = ..., lease_epoch: _Optional[int] = ..., input_ids: _Optional[_Iterable[int]] = ..., prompt_len: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., weight_version: _Optional[int] = ..., prior_logprobs: _Optional[_Iterable[float]] = ..., ticket: _Optional[str] = ...) -> None: ...

class AssignBatch(_message.Message):
    __slots__ = ("assignments",)
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.RepeatedCompositeFieldContainer[Assignment]
    def __init__(self, assignments: _Optional[_Iterable[_Union[Assignment, _Mapping]]] = ...) -> None: ...

class Revoke(_message.Message):
    __slots__ = ("request_ids", "reason")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class DrainCommand(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class SetWeightVersion(_message.Message):
    __slots__ = ("weight_version",)
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    def __init__(self, weight_version: _Optional[int] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("prompt_index", "token_ids", "task_json")
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TASK_JSON_FIELD_NUMBER: _ClassVar[int]
    prompt_index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    task_json: str
    def __init__(self, prompt_index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., task_json: _Optional[str] = ...) -> None: ...

class EpisodeSettings(_message.Message):
    __slots__ = ("max_turns", "max_episode_tokens")
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_turns: int
    max_episode_tokens: int
    def __init__(self, max_turns: _Optional[int] = ..., max_episode_tokens: _Optional[int] = ...) -> None: ...

class RolloutRequest(_message.Message):
    __slots__ = ("step", "weight_version", "prompts", "group_size", "sampling", "vocab_size", "received_request_ids", "packed_trajectories", "target_groups", "carried", "episodes")
    STEP_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    PACKED_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    TARGET_GROUPS_FIELD_NUMBER: _ClassVar[int]
    CARRIED_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    step: int
    weight_version: int
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    group_size: int
    sampling: SamplingParams
    vocab_size: int
    received_request_ids: _containers.RepeatedScalarFieldContainer[str]
    packed_trajectories: bool
    target_groups: int
    carried: _containers.RepeatedCompositeFieldContainer[CarriedGroup]
    episodes: EpisodeSettings
    def __init__(self, step: _Optional[int] = ..., weight_version: _Optional[int] = ..., prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., group_size: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., vocab_size: _Optional[int] = ..., received_request_ids: _Optional[_Iterable[str]] = ..., packed_trajectories: _Optional[bool] = ..., target_groups: _Optional[int] = ..., carried: _Optional[_Iterable[_Union[CarriedGroup, _Mapping]]] = ..., episodes: _Optional[_Union[EpisodeSettings, _Mapping]] = ...) -> None: ...

class CarriedGroup(_message.Message):
    __slots__ = ("step", "prompt_index", "prompt_ids", "sample_indices", "task_json")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDICES_FIELD_NUMBER: _ClassVar[int]
    TASK_JSON_FIELD_NUMBER: _ClassVar[int]
    step: int
    prompt_index: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    sample_indices: _containers.RepeatedScalarFieldContainer[int]
    task_json: str
    def __init__(self, step: _Optional[int] = ..., prompt_index: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., sample_indices: _Optional[_Iterable[int]] = ..., task_json: _Optional[str] = ...) -> None: ...

class VersionSpan(_message.Message):
    __slots__ = ("weight_version", "tokens")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    tokens: int
    def __init__(self, weight_version: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("request_id", "step", "prompt_index", "sample_index", "prompt_ids", "response_ids", "logprobs", "finish_reason", "weight_version", "workers", "response_ids_packed", "logprobs_packed", "version_spans", "loss_mask", "turns", "has_reward", "reward", "episode")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_PACKED_FIELD_NUMBER: _ClassVar[int]
    VERSION_SPANS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    step: int
    prompt_index: int
    sample_index: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    response_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    weight_version: int
    workers: _containers.RepeatedScalarFieldContainer[str]
    response_ids_packed: bytes
    logprobs_packed: bytes
    version_spans: _containers.RepeatedCompositeFieldContainer[VersionSpan]
    loss_mask: bytes
    turns: int
    has_reward: bool
    reward: float
    episode: EpisodeStats
    def __init__(self, request_id: _Optional[str] = ..., step: _Optional[int] = ..., prompt_index: _Optional[int] = ..., sample_index: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., response_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ..., weight_version: _Optional[int] = ..., workers: _Optional[_Iterable[str]] = ..., response_ids_packed: _Optional[bytes] = ..., logprobs_packed: _Optional[bytes] = ..., version_spans: _Optional[_Iterable[_Union[VersionSpan, _Mapping]]] = ..., loss_mask: _Optional[bytes] = ..., turns: _Optional[int] = ..., has_reward: _Optional[bool] = ..., reward: _Optional[float] = ..., episode: _Optional[_Union[EpisodeStats, _Mapping]] = ...) -> None: ...

class EpisodeStats(_message.Message):
    __slots__ = ("tool_calls", "tool_failures", "tool_seconds", "env_error", "runner")
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_FAILURES_FIELD_NUMBER: _ClassVar[int]
    TOOL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENV_ERROR_FIELD_NUMBER: _ClassVar[int]
    RUNNER_FIELD_NUMBER: _ClassVar[int]
    tool_calls: int
    tool_failures: int
    tool_seconds: float
    env_error: str
    runner: str
    def __init__(self, tool_calls: _Optional[int] = ..., tool_failures: _Optional[int] = ..., tool_seconds: _Optional[float] = ..., env_error: _Optional[str] = ..., runner: _Optional[str] = ...) -> None: ...

class TrajectoryBatch(_message.Message):
    __slots__ = ("trajectories",)
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    def __init__(self, trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "pool", "node", "weight_version", "running", "capacity", "tokens_generated", "draining", "memory_released", "inflight_tokens", "tokens_per_s", "weight_sync_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    MEMORY_RELEASED_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SYNC_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    pool: Pool
    node: str
    weight_version: int
    running: int
    capacity: int
    tokens_generated: int
    draining: bool
    memory_released: bool
    inflight_tokens: int
    tokens_per_s: float
    weight_sync_s: float
    def __init__(self, worker_id: _Optional[str] = ..., pool: _Optional[_Union[Pool, str]] = ..., node: _Optional[str] = ..., weight_version: _Optional[int] = ..., running: _Optional[int] = ..., capacity: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., draining: _Optional[bool] = ..., memory_released: _Optional[bool] = ..., inflight_tokens: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., weight_sync_s: _Optional[float] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("workers", "pending", "running", "finished", "migrations", "tokens_received", "tokens_lost", "tokens_regenerated", "migrations_by_reason", "busy_seconds", "runners", "episodes_pending", "episodes_running", "episodes_in_tools", "idle_slot_seconds_in_tools", "episodes_finished", "episodes_failed", "runner_episode_seconds", "runner_capacity_seconds", "episodes_carried", "preemptions", "preempted_slot_seconds", "slot_seconds")
    class MigrationsByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class BusySecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_LOST_FIELD_NUMBER: _ClassVar[int]
    TOKENS_REGENERATED_FIELD_NUMBER: _ClassVar[int]
    MIGRATIONS_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUNNERS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_PENDING_FIELD_NUMBER: _ClassVar[int]
    EPISODES_RUNNING_FIELD_NUMBER: _ClassVar[int]
    EPISODES_IN_TOOLS_FIELD_NUMBER: _ClassVar[int]
    IDLE_SLOT_SECONDS_IN_TOOLS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FINISHED_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FAILED_FIELD_NUMBER: _ClassVar[int]
    RUNNER_EPISODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_CAPACITY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_CARRIED_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SLOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    pending: int
    running: int
    finished: int
    migrations: int
    tokens_received: int
    tokens_lost: int
    tokens_regenerated: int
    migrations_by_reason: _containers.ScalarMap[str, int]
    busy_seconds: _containers.ScalarMap[str, float]
    runners: _containers.RepeatedCompositeFieldContainer[RunnerStatus]
    episodes_pending: int
    episodes_running: int
    episodes_in_tools: int
    idle_slot_seconds_in_tools: float
    episodes_finished: int
    episodes_failed: int
    runner_episode_seconds: float
    runner_capacity_seconds: float
    episodes_carried: int
    preemptions: int
    preempted_slot_seconds: float
    slot_seconds: float
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., pending: _Optional[int] = ..., running: _Optional[int] = ..., finished: _Optional[int] = ..., migrations: _Optional[int] = ..., tokens_received: _Optional[int] = ..., tokens_lost: _Optional[int] = ..., tokens_regenerated: _Optional[int] = ..., migrations_by_reason: _Optional[_Mapping[str, int]] = ..., busy_seconds: _Optional[_Mapping[str, float]] = ..., runners: _Optional[_Iterable[_Union[RunnerStatus, _Mapping]]] = ..., episodes_pending: _Optional[int] = ..., episodes_running: _Optional[int] = ..., episodes_in_tools: _Optional[int] = ..., idle_slot_seconds_in_tools: _Optional[float] = ..., episodes_finished: _Optional[int] = ..., episodes_failed: _Optional[int] = ..., runner_episode_seconds: _Optional[float] = ..., runner_capacity_seconds: _Optional[float] = ..., episodes_carried: _Optional[int] = ..., preemptions: _Optional[int] = ..., preempted_slot_seconds: _Optional[float] = ..., slot_seconds: _Optional[float] = ...) -> None: ...

class RunnerStatus(_message.Message):
    __slots__ = ("runner_id", "node", "capacity", "running", "in_tools", "draining", "episodes_done")
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    IN_TOOLS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    EPISODES_DONE_FIELD_NUMBER: _ClassVar[int]
    runner_id: str
    node: str
    capacity: int
    running: int
    in_tools: int
    draining: bool
    episodes_done: int
    def __init__(self, runner_id: _Optional[str] = ..., node: _Optional[str] = ..., capacity: _Optional[int] = ..., running: _Optional[int] = ..., in_tools: _Optional[int] = ..., draining: _Optional[bool] = ..., episodes_done: _Optional[int] = ...) -> None: ...
