"""The `sglang` engine: SGLang's in-process `Engine` behind the worker's Engine interface (GPUs; CPU for tests).

SGLang runs its scheduler and detokenizer in child processes; this process talks to them through the
engine's `tokenizer_manager`, whose coroutines we await directly on the worker's event loop (the sync
`Engine.*` wrappers call `loop.run_until_complete` and cannot run inside a running loop).

- Generation: `async_generate(input_ids=prompt + tokens so far, stream=True, return_logprob=True)`, with
  `skip_tokenizer_init` (ids in, ids out) and `ignore_eos`: only the assignment's stop ids end a response,
  like the torch engine; the stream is cut here at the first one and the SGLang request aborted. Per-request seeds go in `sampling_seed` with deterministic inference on (GPU), so
  SGLang samples token i from hash(seed, sequence position): a request continued from prompt + k tokens
  draws what the uninterrupted one would have. SGLang refuses deterministic inference with the CPU
  attention backend, so on CPU seeded sampling is not reproducible (`seeded_sampling` is False); greedy
  (temperature 0) is exact everywhere.
- Abort: `tokenizer_manager.abort_request(rid=...)`; the stream ends with finish reason "abort".
- Weights: an update runs between `begin_weight_update` and `end_weight_update`, and sends through
  `update_weights_from_tensor` only the tensors whose bits differ from the state held (a sparse delta
  touches a few tensors). SGLang's model-update lock makes the update wait for running requests, and
  requests arriving during an update wait for it here.
- Memory release / resume (colocation with training): SGLang's `release/resume_memory_occupation`, which
  needs `--enable-memory-saver` and CUDA (torch_memory_saver); on CPU both are logged no-ops. SGLang drops
  the weights' contents on release (unless `enable_weights_cpu_backup`), so resume pushes the whole held
  state back through `update_weights_from_tensor` and the engine generates with exactly the weights it had.

CPU recipe (docs/sglang.md, "Running it on CPU"): env SGLANG_USE_CPU_ENGINE=1 and `Engine(device="cpu",
attention_backend="torch_native", sampling_backend="pytorch", grammar_backend="none", disable_cuda_graph=True,
disable_overlap_schedule=True)`; `scripts/setup_sglang_env.sh` builds an environment where that imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Collection, Mapping
from typing import TYPE_CHECKING, Any

from rlboost.weights.checksum import state_checksum
from rlboost.wire.rollout_io import Assignment
from rollout_worker.engine.base import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    Engine,
    EngineError,
    GenerationStep,
    RepeatedLog,
    has_weights,
    read_model_state,
    refusal,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

_INT64_MAX = (1 << 63) - 1
_FINISH = {"stop": FINISH_STOP, "length": FINISH_LENGTH, "abort": FINISH_ABORT}

# SGLang's CPU path (see module docstring); on CUDA its defaults are used.
CPU_TOKENS_PER_REQUEST = 1024  # KV tokens reserved per concurrent request on CPU (prompt + response)
CPU_MEM_FRACTION = 0.05  # of system memory, per engine, on CPU

CPU_ENGINE_KWARGS: dict[str, Any] = {
    "attention_backend": "torch_native",
    "sampling_backend": "pytorch",
    "grammar_backend": "none",
    "disable_cuda_graph": True,
    "disable_overlap_schedule": True,
}


def _signed64(x: int) -> int:
    """A uint64 seed as the int64 with the same bits (SGLang's sampling_seed is an int64)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x > _INT64_MAX else x


def sglang_available() -> str:
    """'' when sglang imports here, else the reason (for skips and start-up errors)."""
    try:
        import sglang  # noqa: F401
    except Exception as err:  # ImportError, or a CUDA library that fails to load
        return f"sglang is not importable: {type(err).__name__}: {err}"
    return ""


def sampling_params(a: Assignment) -> dict[str, Any]:
    """SGLang sampling params for the rest of an assignment's response."""
    s = a.sampling
    params: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,
        "max_new_tokens": s.max_new_tokens - a.generated,
        # SGLang checks stop_token_ids only together with the model's EOS ids (and not at all with ignore_eos);
        # the assignment's stop ids must be the only stop condition (as in the torch engine), so SGLang
        # ignores EOS and the stream is cut at the first stop id here (SglangEngine.generate).
        "ignore_eos": True,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "sampling_seed": _signed64(s.seed),
    }
    return params


def changed_tensors(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of tensors of `new` whose bits differ from `old` (new names, other shapes or dtypes included)."""
    import torch

    names = []
    for name, tensor in new.items():
        prev = old.get(name)
        if prev is tensor:
            continue
        if prev is None or prev.shape != tensor.shape or prev.dtype != tensor.dtype:
            names.append(name)
            continue
        # Bit patterns, not values: NaN != NaN and -0 == +0 would hide real changes.
        if not torch.equal(prev.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)):
            names.append(name)
    return names


class SglangEngine(Engine):
    """SGLang `Engine` in this process (scheduler in child processes); one request per assignment."""

    name = "sglang"

    def __init__(
        self,
        capacity: int = 64,
        dtype: str = "float32",
        device: str = "cpu",
        mem_fraction_static: float | None = None,
        enable_memory_saver: bool = False,
        extra_args: Mapping[str, Any] | None = None,
        tensor_parallel: int = 1,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity: must be > 0, got {capacity}")
        if tensor_parallel < 1:
            raise ValueError(f"tensorParallel: must be >= 1, got {tensor_parallel}")
        self.capacity = capacity
        self.tensor_parallel = tensor_parallel  # SGLang's tp_size: the model sharded over this many accelerators
        self.dtype = dtype
        self.device = device
        self.mem_fraction_static = mem_fraction_static
        self.enable_memory_saver = enable_memory_saver
        self.extra_args = dict(extra_args or {})
        self._sgl = None  # sglang.Engine
        self._version = 0
        self._state: Mapping[str, torch.Tensor] = {}  # the exact state held; {} until a start without weights gets one
        self._names: frozenset[str] = frozenset()  # the model's tensors (a tied pair once): what a whole state holds
        self._tied: dict[str, str] = {}  # alias -> source of tensors the model ties (stored once)
        self._checksum = ""
        self._running: set[str] = set()
        self._update_lock = asyncio.Lock()
        self._no_update = asyncio.Event()  # set while no weight update is in progress
        self._no_update.set()
        # SGLang honours sampling_seed only under deterministic inference, which it refuses with the CPU
        # attention backend (torch_native): on CPU only greedy decoding is reproducible across migrations.
        self.seeded_sampling = device != "cpu"
        self.startup_s = 0.0
        self.last_update: dict[str, float] = {}
        self.vocab_size = 0  # config.json's vocab_size, set by start: prompt ids are checked against it (0: not)
        self._errors = RepeatedLog(log)  # a refusal repeated per placement logs one line with a count

    # ---- lifecycle -------------------------------------------------------------------------

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    def engine_kwargs(self, model_dir: str) -> dict[str, Any]:
        """The arguments of `sglang.Engine(...)` for this configuration."""
        kwargs: dict[str, Any] = {
            "model_path": model_dir,
            "device": self.device,
            "dtype": self.dtype,
            "max_running_requests": self.capacity,
            "skip_tokenizer_init": True,  # ids in, ids out: no tokenizer needed in the model dir
            # sampling_seed + position -> reproducible tokens; SGLang allows it only with GPU attention backends.
            "enable_deterministic_inference": self.seeded_sampling,
            "random_seed": 0,
            "log_level": "error",
        }
        if self.tensor_parallel > 1:
            kwargs["tp_size"] = self.tensor_parallel
        if self.on_cpu:
            kwargs.update(CPU_ENGINE_KWARGS)
            # On CPU SGLang sizes its KV pool from *system* memory: three engines on one machine
            # were OOM-killed. Bound the pool by what `capacity` requests can use.
            kwargs["max_total_tokens"] = max(4096, self.capacity * CPU_TOKENS_PER_REQUEST)
            kwargs["mem_fraction_static"] = CPU_MEM_FRACTION
        if self.mem_fraction_static is not None:
            kwargs["mem_fraction_static"] = self.mem_fraction_static
        if self.enable_memory_saver:
            kwargs["enable_memory_saver"] = True
        kwargs.update(self.extra_args)
        return kwargs

    async def start(self, model_dir: str, state: Mapping[str, torch.Tensor] | None = None, version: int = 0) -> None:
        """A model directory without weights (only the assets a spot worker pulled from the weight-server) starts
        SGLang with dummy weights; the engine takes no request until update_weights gives it a whole state."""
        reason = sglang_available() if not self.on_cpu else self._cpu_import_reason()
        if reason:
            raise EngineError(f"--engine sglang: {reason}; build it with scripts/setup_sglang_env.sh (CPU)")
        t0 = time.perf_counter()
        weightless = not has_weights(model_dir)
        self.vocab_size = int(_read_config(model_dir).get("vocab_size") or 0)
        # Blocking on purpose: SGLang installs signal handlers and forks children, which must happen on the
        # main thread; nothing else runs on the loop before the worker registers.
        self._sgl = self._launch(model_dir, dummy=weightless)
        # SGLang's request loop, created lazily by its first call, installs a SIGTERM handler of its own on the
        # running loop (it polls, exits the process after up to 20 s, and skips the worker's drain). Create it
        # now, so that the worker's own handler, installed again after start-up, is the one that stays.
        self._sgl.tokenizer_manager.auto_create_handle_loop()
        if weightless:  # the model's tensor names from its config; the weights come with the first update
            names = _config_tensor_names(model_dir)
            self._tied = _tied_aliases(model_dir, names)
            self._names = frozenset(names)
        else:
            disk = read_model_state(model_dir)
            self._tied = _tied_aliases(model_dir, disk)  # published states name both; the files store one
            self._names = frozenset(disk)
            self._state, self._checksum = disk, state_checksum(disk)
        self.startup_s = time.perf_counter() - t0
        if state is not None:
            await self.update_weights(state, version)
        self._version = version
        weights = "held" if self._state else "awaiting the first update"
        log.info(
            "sglang engine ready",
            extra={"startup_s": round(self.startup_s, 2), "device": self.device, "weights": weights},
        )

    def _cpu_import_reason(self) -> str:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
        return sglang_available()

    def _launch(self, model_dir: str, dummy: bool = False):
        import sglang

        kwargs = self.engine_kwargs(model_dir)
        if dummy:  # random weights of the right shapes, replaced by the first (verified) update before any request
            kwargs["load_format"] = "dummy"
        try:
            return sglang.Engine(**kwargs)
        except Exception as err:
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise EngineError(f"cannot start SGLang on {model_dir}: {type(err).__name__}: {first_line}") from None

    async def close(self) -> None:
        if self._sgl is None:
            return
        sgl, self._sgl = self._sgl, None
        self._errors.flush()
        with contextlib.suppress(Exception):
            sgl.tokenizer_manager.abort_request(abort_all=True)
        await asyncio.to_thread(sgl.shutdown)  # kills SGLang's child processes

    # ---- the interface ---------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def _tm(self):
        if self._sgl is None:
            raise EngineError("engine is not running")
        return self._sgl.tokenizer_manager

    async def generate(self, assignment: Assignment) -> AsyncIterator[GenerationStep]:
        rid = assignment.request_id
        tm = self._tm
        if rid in self._running:
            raise EngineError(f"request {rid} is already running")
        if self.memory_released:
            raise EngineError("generate: engine memory is released (colocation); call resume_memory() first")
        if not self._state:
            raise EngineError("generate: the engine started without weights; update_weights must give it a version")
        offset = assignment.generated
        refused = refusal(assignment, self.vocab_size, self._errors)
        if refused is not None:  # refused alone, before it joins a batch whose every step it would fail
            yield refused
            return
        if offset >= assignment.sampling.max_new_tokens:  # a migrated request that had used its whole budget
            yield GenerationStep(rid, offset, [], [], True, FINISH_LENGTH)
            return
        self._running.add(rid)
        try:
            await self._no_update.wait()  # requests arriving during an update run on the new weights
            stream = await self._sgl.async_generate(
                input_ids=list(assignment.input_ids),
                sampling_params=sampling_params(assignment),
                stream=True,
                return_logprob=True,
                rid=rid,
            )
            seen = 0  # response tokens of this request already yielded
            stop = frozenset(assignment.sampling.stop_token_ids)
            async for out in stream:
                step, seen = _to_step(rid, offset, seen, out)
                if stop:
                    cut = _cut_at_stop(step, stop)
                    if cut.finished and not step.finished:
                        tm.abort_request(rid=rid)  # SGLang would go on decoding past our stop id
                    step = cut
                if step.token_ids or step.finished:
                    yield step
                if step.finished:
                    return
            yield GenerationStep(rid, offset + seen, [], [], True, FINISH_ABORT)  # stream ended without a reason
        finally:
            self._running.discard(rid)
            if self._sgl is not None and rid in tm.rid_to_state:
                tm.abort_request(rid=rid)  # the consumer went away: free the slot

    def abort(self, request_id: str) -> bool:
        if request_id not in self._running or self._sgl is None:
            return False
        self._tm.abort_request(rid=request_id)
        return True

    async def update_weights(
        self, state: Mapping[str, torch.Tensor], version: int, checksum: str | None = None, resend_all: bool = False
    ) -> None:
        """Send the tensors of `state` that differ from the state held (all of them with `resend_all`, after a
        memory resume), in one begin/end weight-update session. `checksum`: state_checksum(state), when the
        caller verified it already (used only for a whole state; a partial one is merged and hashed here)."""
        tm = self._tm
        from sglang.srt.managers.io_struct import (
            BeginWeightUpdateReqInput,
            EndWeightUpdateReqInput,
            UpdateWeightsFromTensorReqInput,
        )

        async with self._update_lock:
            self._no_update.clear()
            try:
                t0 = time.perf_counter()
                names = list(state) if resend_all else changed_tensors(self._state, state)
                unknown = [n for n in state if n not in self._names and n not in self._tied]
                if unknown:
                    raise EngineError(f"weights: {len(unknown)} tensors are not in the model, e.g. {unknown[0]!r}")
                # A whole state replaces what is held (as in the torch engine); a partial one updates it.
                whole = self._names <= set(state)
                if not whole and not self._state:
                    missing = sorted(self._names - set(state))
                    raise EngineError(
                        "weights: the engine started without weights, so its first update must be a whole state; "
                        f"{len(missing)} tensors are missing, e.g. {missing[0]!r}"
                    )
                _check_tied(self._tied, state)
                names = [n for n in names if n not in self._tied]  # SGLang holds one tensor for a tied pair
                if names:
                    await _checked(tm.begin_weight_update(BeginWeightUpdateReqInput(), None), "begin_weight_update")
                    try:
                        payload = self._sgl._serialize_tensors_per_rank([(n, state[n]) for n in names], None)
                        req = UpdateWeightsFromTensorReqInput(serialized_named_tensors=payload, flush_cache=True)
                        await _checked(tm.update_weights_from_tensor(req, None), "update_weights_from_tensor")
                    finally:
                        await _checked(tm.end_weight_update(EndWeightUpdateReqInput(), None), "end_weight_update")
                merged = dict(state) if whole else {**self._state, **state}
                self._state = merged
                self._checksum = (checksum if whole and checksum else None) or state_checksum(merged)
                self._version = version
                self.last_update = {"tensors": len(names), "seconds": time.perf_counter() - t0}
                log.info("weights updated in place", extra={"weight_version": version, **self.last_update})
            finally:
                self._no_update.set()

    # ---- memory release / resume (colocation; the protocol is base.Engine's) ---------------

    @property
    def _memory_saver(self) -> bool:
        """SGLang frees and restores memory only on CUDA with enable_memory_saver (torch_memory_saver)."""
        return not self.on_cpu and self.enable_memory_saver

    async def _free_memory(self) -> tuple[int, bool]:
        """`release_memory_occupation`: KV cache and weights off the GPU; a logged no-op without the memory saver."""
        async with self._update_lock:  # not in the middle of a weight update
            if not self._memory_saver:
                log.info("release_memory_occupation: no-op (needs CUDA and enable_memory_saver)")
                return 0, False
            from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput

            await self._tm.release_memory_occupation(ReleaseMemoryOccupationReqInput(), None)
        return self._state_bytes(), True

    async def _restore_memory(self) -> tuple[int, bool]:
        """`resume_memory_occupation`, then the exact held state again: the weights' pages come back empty."""
        if not self._memory_saver:
            return 0, False
        from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput

        await self._tm.resume_memory_occupation(ResumeMemoryOccupationReqInput(), None)
        await self.update_weights(dict(self._state), self._version, self._checksum, resend_all=True)
        return self._state_bytes(), True

    def _state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._state.values())


def _to_step(rid: str, offset: int, seen: int, out: dict[str, Any]) -> tuple[GenerationStep, int]:
    """One streamed SGLang output (cumulative or incremental ids) as the step of the tokens not yet yielded."""
    meta = out.get("meta_info", {})
    ids = list(out.get("output_ids") or [])
    lps = [lp for lp, *_ in meta.get("output_token_logprobs") or []]
    total = int(meta.get("completion_tokens", len(ids)))
    # SGLang streams cumulative ids by default and deltas with --incremental-streaming-output.
    new_ids = ids[seen:] if len(ids) == total else ids[len(ids) - (total - seen) :] if total > seen else []
    new_lps = lps[seen:] if len(lps) == total else lps[len(lps) - len(new_ids) :] if new_ids else []
    reason = meta.get("finish_reason")
    finished = reason is not None
    kind = _FINISH.get(reason.get("type", "abort"), FINISH_ABORT) if isinstance(reason, dict) else FINISH_ABORT
    step = GenerationStep(rid, offset + seen, new_ids, [float(x) for x in new_lps], finished, kind if finished else "")
    return step, seen + len(new_ids)


def _cut_at_stop(step: GenerationStep, stop: frozenset[int]) -> GenerationStep:
    """The step up to and including its first stop id, finished with FINISH_STOP (unchanged if it has none)."""
    for i, token in enumerate(step.token_ids):
        if token in stop:
            return GenerationStep(
                step.request_id, step.offset, step.token_ids[: i + 1], step.logprobs[: i + 1], True, FINISH_STOP
            )
    return step


async def _checked(coro, what: str) -> None:
    result = await coro
    if isinstance(result, tuple) and result and result[0] is False:
        raise EngineError(f"SGLang {what} failed: {result[1] if len(result) > 1 else 'no message'}")


def _tied_aliases(model_dir: str, names: Collection[str]) -> dict[str, str]:
    """{"lm_head.weight": "model.embed_tokens.weight"} when the model ties them and the files (`names`) store one."""
    config = _read_config(model_dir)
    tied = config.get("tie_word_embeddings", False) and "lm_head.weight" not in names
    return {"lm_head.weight": "model.embed_tokens.weight"} if tied and "model.embed_tokens.weight" in names else {}


def _read_config(model_dir: str) -> dict[str, Any]:
    import json
    from pathlib import Path

    return json.loads((Path(model_dir) / "config.json").read_text())


def _config_tensor_names(model_dir: str) -> set[str]:
    """The names of a model's tensors as its files store them (a tied lm_head once, under the embedding), from
    config.json alone: the model is built on the meta device (no memory, no weights) for its state_dict's keys."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(model_dir)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError) as err:
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise EngineError(f"cannot build the model from {model_dir}/config.json: {first_line}") from None
    names = set(model.state_dict())
    if _read_config(model_dir).get("tie_word_embeddings", False) and "model.embed_tokens.weight" in names:
        names.discard("lm_head.weight")
    return names


def _check_tied(tied: Mapping[str, str], state: Mapping[str, torch.Tensor]) -> None:
    """A tied pair must carry the same bits: SGLang cannot hold them apart."""
    import torch

    for alias, source in tied.items():
        if (
            alias in state
            and source in state
            and not torch.equal(state[alias].view(torch.uint8), state[source].view(torch.uint8))
        ):
            raise EngineError(f"weights: {alias} differs from {source}, but the model ties them (tie_word_embeddings)")
