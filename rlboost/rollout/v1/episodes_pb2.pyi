from rlboost.rollout.v1 import rollout_pb2 as _rollout_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunnerMessage(_message.Message):
    __slots__ = ("register", "turn", "result", "heartbeat", "drain")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    register: RunnerRegister
    turn: TurnRequest
    result: EpisodeResult
    heartbeat: RunnerHeartbeat
    drain: _rollout_pb2.DrainNotice
    def __init__(self, register: _Optional[_Union[RunnerRegister, _Mapping]] = ..., turn: _Optional[_Union[TurnRequest, _Mapping]] = ..., result: _Optional[_Union[EpisodeResult, _Mapping]] = ..., heartbeat: _Optional[_Union[RunnerHeartbeat, _Mapping]] = ..., drain: _Optional[_Union[_rollout_pb2.DrainNotice, _Mapping]] = ...) -> None: ...

class RunnerRegister(_message.Message):
    __slots__ = ("runner_id", "node", "capacity", "session_token")
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runner_id: str
    node: str
    capacity: int
    session_token: str
    def __init__(self, runner_id: _Optional[str] = ..., node: _Optional[str] = ..., capacity: _Optional[int] = ..., session_token: _Optional[str] = ...) -> None: ...

class TurnRequest(_message.Message):
    __slots__ = ("episode_id", "lease_epoch", "turn", "input_ids_packed", "max_new_tokens")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    INPUT_IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    lease_epoch: int
    turn: int
    input_ids_packed: bytes
    max_new_tokens: int
    def __init__(self, episode_id: _Optional[str] = ..., lease_epoch: _Optional[int] = ..., turn: _Optional[int] = ..., input_ids_packed: _Optional[bytes] = ..., max_new_tokens: _Optional[int] = ...) -> None: ...

class RunnerHeartbeat(_message.Message):
    __slots__ = ("running", "in_tools")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    IN_TOOLS_FIELD_NUMBER: _ClassVar[int]
    running: int
    in_tools: int
    def __init__(self, running: _Optional[int] = ..., in_tools: _Optional[int] = ...) -> None: ...

class EpisodeResult(_message.Message):
    __slots__ = ("episode_id", "lease_epoch", "prompt_ids", "response_ids_packed", "logprobs_packed", "loss_mask", "version_spans", "finish_reason", "has_reward", "reward", "turns", "stats", "workers")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_PACKED_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    VERSION_SPANS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    HAS_REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    lease_epoch: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    response_ids_packed: bytes
    logprobs_packed: bytes
    loss_mask: bytes
    version_spans: _containers.RepeatedCompositeFieldContainer[_rollout_pb2.VersionSpan]
    finish_reason: str
    has_reward: bool
    reward: float
    turns: int
    stats: _rollout_pb2.EpisodeStats
    workers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, episode_id: _Optional[str] = ..., lease_epoch: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., response_ids_packed: _Optional[bytes] = ..., logprobs_packed: _Optional[bytes] = ..., loss_mask: _Optional[bytes] = ..., version_spans: _Optional[_Iterable[_Union[_rollout_pb2.VersionSpan, _Mapping]]] = ..., finish_reason: _Optional[str] = ..., has_reward: _Optional[bool] = ..., reward: _Optional[float] = ..., turns: _Optional[int] = ..., stats: _Optional[_Union[_rollout_pb2.EpisodeStats, _Mapping]] = ..., workers: _Optional[_Iterable[str]] = ...) -> None: ...

class RunnerCommand(_message.Message):
    __slots__ = ("registered", "assign", "turn", "cancel")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    registered: RunnerRegistered
    assign: EpisodeAssignBatch
    turn: TurnResult
    cancel: EpisodeCancel
    def __init__(self, registered: _Optional[_Union[RunnerRegistered, _Mapping]] = ..., assign: _Optional[_Union[EpisodeAssignBatch, _Mapping]] = ..., turn: _Optional[_Union[TurnResult, _Mapping]] = ..., cancel: _Optional[_Union[EpisodeCancel, _Mapping]] = ...) -> None: ...

class RunnerRegistered(_message.Message):
    __slots__ = ("heartbeat_interval_ms", "session_token")
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_ms: int
    session_token: str
    def __init__(self, heartbeat_interval_ms: _Optional[int] = ..., session_token: _Optional[str] = ...) -> None: ...

class EpisodeAssignment(_message.Message):
    __slots__ = ("episode_id", "lease_epoch", "step", "prompt_index", "sample_index", "task_json", "sampling", "weight_version", "max_turns", "max_episode_tokens")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TASK_JSON_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    lease_epoch: int
    step: int
    prompt_index: int
    sample_index: int
    task_json: str
    sampling: _rollout_pb2.SamplingParams
    weight_version: int
    max_turns: int
    max_episode_tokens: int
    def __init__(self, episode_id: _Optional[str] = ..., lease_epoch: _Optional[int] = ..., step: _Optional[int] = ..., prompt_index: _Optional[int] = ..., sample_index: _Optional[int] = ..., task_json: _Optional[str] = ..., sampling: _Optional[_Union[_rollout_pb2.SamplingParams, _Mapping]] = ..., weight_version: _Optional[int] = ..., max_turns: _Optional[int] = ..., max_episode_tokens: _Optional[int] = ...) -> None: ...

class EpisodeAssignBatch(_message.Message):
    __slots__ = ("assignments",)
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    assignments: _containers.RepeatedCompositeFieldContainer[EpisodeAssignment]
    def __init__(self, assignments: _Optional[_Iterable[_Union[EpisodeAssignment, _Mapping]]] = ...) -> None: ...

class TurnResult(_message.Message):
    __slots__ = ("episode_id", "turn", "token_ids_packed", "logprobs_packed", "finish_reason", "weight_version", "version_spans", "workers", "error")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_PACKED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_SPANS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    turn: int
    token_ids_packed: bytes
    logprobs_packed: bytes
    finish_reason: str
    weight_version: int
    version_spans: _containers.RepeatedCompositeFieldContainer[_rollout_pb2.VersionSpan]
    workers: _containers.RepeatedScalarFieldContainer[str]
    error: str
    def __init__(self, episode_id: _Optional[str] = ..., turn: _Optional[int] = ..., token_ids_packed: _Optional[bytes] = ..., logprobs_packed: _Optional[bytes] = ..., finish_reason: _Optional[str] = ..., weight_version: _Optional[int] = ..., version_spans: _Optional[_Iterable[_Union[_rollout_pb2.VersionSpan, _Mapping]]] = ..., workers: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ...) -> None: ...

class EpisodeCancel(_message.Message):
    __slots__ = ("episode_ids", "reason")
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, episode_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...
