"""The `torch` engine: a transformers causal LM with KV cache and continuous batching, for CPUs and tests.

Requests arriving while others decode join in *cohorts*: each cohort is prefilled together (left padding,
attention mask, position ids from the mask) and owns its KV cache; every scheduler iteration prefills at
most one new cohort and advances every live cohort by one token, so cohorts interleave. Finished and
aborted rows are cut out of their cohort's cache. Rows of a cohort with the same input ids (the samples of
one GRPO group) are prefilled once and their cache copied to each (`rlboost_worker_prefill_shared_rows_total`).
Token i of a response is drawn with `rlboost.sampling.sample_next(seed, position=i)`, so results do not depend
on batching or migration.

Weights: the pulled state (bf16, kept as is for checksums) is copied into the model's compute dtype
(float32 on CPU by default). An update is a barrier: requests submitted before it finish on the old
weights, those submitted after it wait for the new ones.

Memory release (colocation with the trainer, `trainer.colocateReserved`): when idle, release_memory() drops
the KV caches and frees the model's compute-dtype parameters (the bulk of the engine's memory: float32 is
twice the bf16 state), returning the pages to the OS; the exact bf16 state pulled stays (it is the
weight puller's base for deltas, host memory on a GPU too). resume_memory() allocates the parameters again,
copies the held state back in (the same deterministic cast as an update) and checks the parameters'
checksum equals the one taken before the release, so generation continues bit for bit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field

import torch

from rlboost.sampling import sample_next
from rlboost.weights.checksum import state_checksum
from rlboost.wire.rollout_io import Assignment
from rollout_worker import metrics
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

log = logging.getLogger(__name__)

_INT64_MAX = (1 << 63) - 1


def _signed64(x: int) -> int:
    """A uint64 seed as the int64 with the same bits (sample_next takes int64 tensors)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x > _INT64_MAX else x


@dataclass(eq=False)
class _Request:
    """One request's state; mutated only on the event loop (the decode thread reads it)."""

    a: Assignment
    epoch: int  # weight updates requested before this request arrived (the barrier it belongs to)
    produced: int  # response tokens so far (starts at the tokens generated before a migration)
    stop: frozenset[int]
    tokens: list[int] = field(default_factory=list)  # produced since the consumer last read
    logprobs: list[float] = field(default_factory=list)
    read_offset: int = 0  # response index of tokens[0]
    done: bool = False
    reason: str = ""
    error: str = ""  # it failed here by itself (see _isolate)
    history: list[int] = field(default_factory=list)  # every token produced here: a re-prefill continues after them
    isolated: bool = False  # its batch failed: it is prefilled and decoded alone from now on
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def input_ids(self) -> list[int]:
        """What a prefill of this request reads: its assignment's prompt + tokens, then the tokens made here."""
        return list(self.a.input_ids) + self.history

    def push(self, token: int, logprob: float) -> None:
        self.tokens.append(token)
        self.history.append(token)
        self.logprobs.append(logprob)
        self.produced += 1
        if token in self.stop:
            self.finish(FINISH_STOP)
        elif self.produced >= self.a.sampling.max_new_tokens:
            self.finish(FINISH_LENGTH)
        self.wake.set()

    def finish(self, reason: str, error: str = "") -> None:
        if not self.done:
            self.done, self.reason, self.error = True, reason, error
            self.wake.set()

    def take(self) -> GenerationStep:
        step = GenerationStep(
            self.a.request_id, self.read_offset, self.tokens, self.logprobs, self.done, self.reason if self.done else ""
        )
        step.error = self.error
        self.read_offset += len(self.tokens)
        self.tokens, self.logprobs = [], []
        self.wake.clear()
        return step


@dataclass
class _Cohort:
    """Requests prefilled together, sharing one KV cache (rows in `reqs` order)."""

    reqs: list[_Request]
    cache: object  # transformers DynamicCache
    mask: torch.Tensor  # [B, L] attention mask over everything in the cache
    next_pos: torch.Tensor  # [B] position id of the next input token
    last: torch.Tensor  # [B] last sampled token (next decode input)


@dataclass
class _Update:
    state: Mapping[str, torch.Tensor]
    version: int
    done: asyncio.Future
    checksum: str | None = None  # state_checksum(state) when the caller verified it already


class TorchEngine(Engine):
    """transformers model + KV cache, batched, on CPU (or one CUDA device)."""

    name = "torch"

    def __init__(self, capacity: int = 64, dtype: str = "float32", device: str = "cpu") -> None:
        if capacity <= 0:
            raise ValueError(f"capacity: must be > 0, got {capacity}")
        self.capacity = capacity
        self.dtype = getattr(torch, dtype)
        self.device = torch.device(device)
        self.model = None
        self._version = 0
        self._state: Mapping[str, torch.Tensor] = {}
        self._checksum = ""
        self._reqs: dict[str, _Request] = {}
        self._waiting: list[_Request] = []
        self._cohorts: list[_Cohort] = []
        self._updates: list[_Update] = []
        self._epoch_requested = 0  # updates requested so far
        self._epoch_applied = 0  # updates applied so far
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._closed = False
        self._compute = asyncio.Lock()  # held while the decode thread or an update touches the model
        self._shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}  # freed parameters, for resume
        self.vocab_size = 0  # rows of the input embedding, set by start: prompt ids are checked against it
        self._errors = RepeatedLog(log)  # a failure that repeats every iteration logs one line with a count
        self._params_sum = ""  # checksum of the compute parameters taken at release, checked at resume

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self, model_dir: str, state: Mapping[str, torch.Tensor] | None = None, version: int = 0) -> None:
        """A model directory without weights (only the assets a worker pulled from the weight-server) builds the
        model from its config; it generates nothing sensible until update_weights gives it a version."""
        self.model = await asyncio.to_thread(self._load_model, model_dir)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        if state is None and has_weights(model_dir):
            state = await asyncio.to_thread(read_model_state, model_dir)
        if state is not None:
            await asyncio.to_thread(self._apply_state, state)
        self._version = version
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="torch-engine")

    def _load_model(self, model_dir: str):
        from transformers import AutoConfig, AutoModelForCausalLM

        try:
            if has_weights(model_dir):
                model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self.dtype)
            else:  # the weights come from the weight-server
                config = AutoConfig.from_pretrained(model_dir)
                model = AutoModelForCausalLM.from_config(config, dtype=self.dtype)
        except (OSError, ValueError) as err:
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise EngineError(f"cannot load a model from {model_dir}: {first_line}") from None
        if str(self.device).startswith("cuda"):
            _avoid_per_shape_attention_plans()
        return model.to(self.device).eval()

    def _apply_state(self, state: Mapping[str, torch.Tensor], checksum: str | None = None) -> None:
        """Copy every tensor of `state` into the model (cast to the compute dtype); keep `state` for checksums.
        `checksum`: state_checksum(state) if the caller has it (then the state is not hashed again)."""
        targets = self.model.state_dict()
        unknown = sorted(set(state) - set(targets))
        if unknown:
            raise EngineError(f"weights: {len(unknown)} tensors are not in the model, e.g. {unknown[0]!r}")
        missing = sorted(n for n, _ in self.model.named_parameters() if n not in state)
        if missing:
            raise EngineError(f"weights: {len(missing)} model parameters are missing, e.g. {missing[0]!r}")
        for name, tensor in state.items():
            if tuple(targets[name].shape) != tuple(tensor.shape):
                raise EngineError(
                    f"weights: {name} has shape {tuple(tensor.shape)}, model expects {tuple(targets[name].shape)}"
                )
        with torch.no_grad():
            for name, tensor in state.items():
                targets[name].copy_(tensor.to(device=self.device, dtype=targets[name].dtype))
        self._state = state
        self._checksum = checksum or state_checksum(state)

    async def close(self) -> None:
        self._closed = True
        for req in list(self._reqs.values()):
            req.finish(FINISH_ABORT)
        for upd in self._updates:
            if not upd.done.done():
                upd.done.set_exception(EngineError("engine closed before the weight update was applied"))
        if self._task:
            self._wake.set()
            await self._task
        self._errors.flush()

    # ---- the interface ---------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._reqs)

    async def generate(self, assignment: Assignment) -> AsyncIterator[GenerationStep]:
        self._check_usable("generate")
        if not self._state:
            raise EngineError("generate: the engine started without weights; update_weights must give it a version")
        rid = assignment.request_id
        if rid in self._reqs:
            raise EngineError(f"request {rid} is already running")
        refused = refusal(assignment, self.vocab_size, self._errors)
        if refused is not None:  # refused alone, before it joins a batch whose every step it would fail
            yield refused
            return
        req = _Request(
            assignment, self._epoch_requested, assignment.generated, frozenset(assignment.sampling.stop_token_ids)
        )
        req.read_offset = assignment.generated
        if req.produced >= assignment.sampling.max_new_tokens:
            req.finish(FINISH_LENGTH)  # a migrated request that had already used its whole budget
        else:
            self._reqs[rid] = req
            self._waiting.append(req)
            self._wake.set()
        try:
            while True:
                await req.wake.wait()
                step = req.take()
                yield step
                if step.finished:
                    return
        finally:
            # The consumer went away (or we finished): make sure the scheduler drops the row.
            req.finish(FINISH_ABORT)
            self._reqs.pop(rid, None)

    def abort(self, request_id: str) -> bool:
        req = self._reqs.get(request_id)
        if req is None or req.done:
            return False
        req.finish(FINISH_ABORT)
        self._wake.set()
        return True

    async def update_weights(
        self, state: Mapping[str, torch.Tensor], version: int, checksum: str | None = None
    ) -> None:
        self._check_usable("update_weights")
        upd = _Update(state, version, asyncio.get_running_loop().create_future(), checksum)
        self._updates.append(upd)
        self._epoch_requested += 1
        self._wake.set()
        await upd.done

    def _check_usable(self, what: str) -> None:
        self._check_running()
        if self.memory_released:
            raise EngineError(f"{what}: engine memory is released (colocation); call resume_memory() first")

    def _check_running(self) -> None:
        if self._task is None or self._closed:
            raise EngineError("engine is not running")

    # ---- memory release / resume (colocation; the protocol is base.Engine's) ---------------

    async def _free_memory(self) -> tuple[int, bool]:
        self._check_running()
        async with self._compute:  # the decode thread is not inside the model now
            self._check_idle("release_memory")
            if self._updates:
                raise EngineError("release_memory: a weight update is pending; wait for it first")
            nbytes = await asyncio.to_thread(self._free_parameters)
        log.info("engine memory released", extra={"bytes": nbytes})
        return nbytes, True

    async def _restore_memory(self) -> tuple[int, bool]:
        async with self._compute:
            nbytes = await asyncio.to_thread(self._restore_parameters)
        log.info("engine memory resumed", extra={"bytes": nbytes, "weight_version": self._version})
        return nbytes, True

    def _params_checksum(self) -> str:
        return state_checksum({n: p.detach() for n, p in self.model.named_parameters()})

    def _free_parameters(self) -> int:
        """Drop the KV caches and every parameter's storage (tied parameters once); returns the bytes freed."""
        self._params_sum = self._params_checksum()
        self._cohorts = []  # idle: only pruned cohorts remain, but their caches may hold memory
        nbytes = 0
        self._shapes = {}
        for name, p in self.model.named_parameters():
            self._shapes[name] = (p.shape, p.dtype)
            nbytes += p.numel() * p.element_size()
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)  # refcount frees the storage now
        _trim_heap()  # (no gc.collect(): a full collection costs ~0.4 s with transformers loaded)
        return nbytes

    def _restore_parameters(self) -> int:
        """Allocate the parameters again and copy the held state in; the result must match the release's checksum."""
        nbytes = 0
        for name, p in self.model.named_parameters():
            shape, dtype = self._shapes[name]
            p.data = torch.empty(shape, dtype=dtype, device=self.device)
            nbytes += p.numel() * p.element_size()
        self._apply_state(self._state, self._checksum)  # the held state, unchanged since it was hashed
        got = self._params_checksum()
        if got != self._params_sum:
            raise EngineError(f"resume_memory: parameters checksum {got[:16]} != {self._params_sum[:16]} at release")
        return nbytes

    # ---- scheduler -------------------------------------------------------------------------

    async def _loop(self) -> None:
        while not self._closed:
            await self._maybe_apply_update()
            self._waiting = [r for r in self._waiting if not r.done]
            admitted = self._admit()
            if not admitted and not self._cohorts:
                self._wake.clear()
                if not self._waiting or not self._can_admit():
                    await self._wake.wait()
                continue
            try:
                async with self._compute:
                    results, failed = await asyncio.to_thread(self._iterate, admitted)
            except Exception as err:  # outside any one batch's step (e.g. pruning a cache): every request goes
                what = f"decode iteration failed: {type(err).__name__}"
                self._errors.error(what, f"{what}: {_one_line(err)}; aborting its requests", exc_info=err)
                for req in admitted + [r for c in self._cohorts for r in c.reqs]:
                    req.finish(FINISH_ABORT)
                self._cohorts = []
                continue
            for req, token, logprob in results:
                if not req.done:  # aborted while the iteration ran: drop what it produced
                    req.push(token, logprob)
            for reqs, err in failed:
                self._isolate(reqs, err)

    def _isolate(self, reqs: list[_Request], err: Exception) -> None:
        """A batch's step failed: a request that was alone in it failed by itself (it ends with the error, the
        manager decides what follows); the requests of a larger batch are prefilled again one at a time from
        prompt + tokens so far (the same tokens: sampling depends on seed and position only), so the one at
        fault fails alone and the others go on."""
        live = [r for r in reqs if not r.done]
        if len(reqs) == 1:
            for req in live:
                error = f"generation failed: {type(err).__name__}: {_one_line(err)}"
                self._errors.error(f"request failed alone: {type(err).__name__}", error, request_id=req.a.request_id)
                req.finish(FINISH_ABORT, error)
            return
        self._errors.error(
            f"batch step failed: {type(err).__name__}",
            f"a batch step failed ({type(err).__name__}: {_one_line(err)}); retrying its {len(live)} requests "
            "one at a time",
            exc_info=err,
        )
        for req in live:
            req.isolated = True
        self._waiting[:0] = live  # first in line: re-prefilled before anything new
        self._wake.set()

    def _can_admit(self) -> bool:
        live = sum(len(c.reqs) for c in self._cohorts)
        return live < self.capacity and bool(self._waiting) and self._waiting[0].epoch == self._epoch_applied

    def _admit(self) -> list[_Request]:
        room = self.capacity - sum(len(c.reqs) for c in self._cohorts)
        admitted: list[_Request] = []
        # Only requests of the weights held now; later ones wait behind the update barrier. An isolated request
        # (its batch failed) is a cohort of its own.
        while self._waiting and len(admitted) < room and self._waiting[0].epoch == self._epoch_applied:
            if self._waiting[0].isolated and admitted:
                break
            admitted.append(self._waiting.pop(0))
            if admitted[0].isolated:
                break
        return admitted

    async def _maybe_apply_update(self) -> None:
        if not self._updates:
            return
        old_epoch_left = any(r.epoch == self._epoch_applied and not r.done for r in self._reqs.values())
        if old_epoch_left or self._cohorts:
            return
        upd = self._updates.pop(0)
        try:
            async with self._compute:
                await asyncio.to_thread(self._apply_state, upd.state, upd.checksum)
        except Exception as err:  # a bad state leaves the old weights in place
            upd.done.set_exception(err)
            self._epoch_applied += 1
            return
        self._version = upd.version
        self._epoch_applied += 1
        log.info("weights updated in place", extra={"weight_version": upd.version, "checksum": self._checksum})
        upd.done.set_result(None)

    # ---- the decode thread -----------------------------------------------------------------

    def _iterate(
        self, admitted: list[_Request]
    ) -> tuple[list[tuple[_Request, int, float]], list[tuple[list[_Request], Exception]]]:
        """One scheduler iteration: prune, prefill the admitted cohort, decode every older cohort once. A cohort
        whose step fails is dropped (its cache may be half written) and returned with the error; the others go on."""
        results: list[tuple[_Request, int, float]] = []
        failed: list[tuple[list[_Request], Exception]] = []
        with torch.inference_mode():
            self._cohorts = [c for c in (self._prune(c) for c in self._cohorts) if c is not None]
            healthy = []
            for cohort in self._cohorts:
                try:
                    results += self._decode(cohort)
                    healthy.append(cohort)
                except Exception as err:
                    failed.append((cohort.reqs, err))
            self._cohorts = healthy
            if admitted:
                try:
                    cohort, first = self._prefill(admitted)
                    self._cohorts.append(cohort)
                    results += first
                except Exception as err:
                    failed.append((admitted, err))
        return results, failed

    def _prune(self, c: _Cohort) -> _Cohort | None:
        keep = [i for i, r in enumerate(c.reqs) if not r.done]
        if not keep:
            return None
        if len(keep) < len(c.reqs):
            idx = torch.tensor(keep, device=self.device)
            c.cache.batch_select_indices(idx)
            c.reqs = [c.reqs[i] for i in keep]
            c.mask, c.next_pos, c.last = c.mask[idx], c.next_pos[idx], c.last[idx]
        return c

    def _prefill(self, reqs: list[_Request]) -> tuple[_Cohort, list[tuple[_Request, int, float]]]:
        """Prefill a new cohort. Rows with the same input ids (a GRPO group's samples share their prompt) are run
        through the model once; their KV cache, mask and positions are then copied to every row of the group."""
        from transformers import DynamicCache

        unique, rows = _shared_rows([r.input_ids() for r in reqs])
        width = max(len(x) for x in unique)
        ids = torch.zeros((len(unique), width), dtype=torch.long)
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        for i, x in enumerate(unique):
            n = len(x)
            ids[i, width - n :] = torch.tensor(x, dtype=torch.long)
            mask[i, width - n :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        shared = torch.tensor(rows, device=self.device) if len(unique) < len(reqs) else None
        with self._head_over(shared):
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        if shared is not None:
            cache.batch_select_indices(shared)  # indexing copies: each row then grows its own cache
            mask, pos = mask[shared], pos[shared]
            metrics.PREFILL_SHARED_ROWS.inc(len(reqs) - len(unique))
        metrics.PREFILL_ROWS.inc(len(reqs))
        cohort = _Cohort(
            reqs, cache, mask, pos[:, -1] + 1, torch.zeros(len(reqs), dtype=torch.long, device=self.device)
        )
        return cohort, self._sample(cohort, out.logits[:, -1, :])

    @contextlib.contextmanager
    def _head_over(self, idx: torch.Tensor | None) -> Iterator[None]:
        """While set, the LM head (and what the model does after it) runs over every row of the cohort: its input,
        the last position's hidden states of the unique rows, is expanded by `idx` first. On one CPU thread (as
        `rlboost local` runs workers) the head is the one op of the prefill whose bits depend on the row count (a
        product with under 4 rows takes another kernel: 1.9e-06 apart on the default model), so the logits stay
        those of a prefill of every row, bit for bit. (With several threads, or on CUDA, a row's bits may depend on
        the row count elsewhere too, as they did before sharing.)"""
        if idx is None:
            yield
            return
        hook = self.model.get_output_embeddings().register_forward_pre_hook(lambda _m, args: (args[0][idx],))
        try:
            yield
        finally:
            hook.remove()

    def _decode(self, c: _Cohort) -> list[tuple[_Request, int, float]]:
        c.mask = torch.cat([c.mask, torch.ones((len(c.reqs), 1), dtype=c.mask.dtype, device=self.device)], dim=-1)
        out = self.model(
            input_ids=c.last[:, None],
            attention_mask=c.mask,
            position_ids=c.next_pos[:, None],
            past_key_values=c.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        c.next_pos = c.next_pos + 1
        return self._sample(c, out.logits[:, -1, :])

    def _sample(self, c: _Cohort, logits: torch.Tensor) -> list[tuple[_Request, int, float]]:
        s = [r.a.sampling for r in c.reqs]
        temperature = torch.tensor([x.temperature for x in s], dtype=torch.float32, device=self.device)
        seed = torch.tensor([_signed64(x.seed) for x in s], dtype=torch.int64, device=self.device)
        # Position = index in the response, so a continued request draws what the original would have.
        position = torch.tensor([r.produced for r in c.reqs], dtype=torch.int64, device=self.device)
        top_p = None
        if any(x.top_p < 1.0 for x in s):
            top_p = torch.tensor([x.top_p for x in s], dtype=torch.float32, device=self.device)
        tokens, logprobs = sample_next(logits, temperature, seed, position, top_p)
        c.last = tokens.to(self.device)
        return list(zip(c.reqs, tokens.tolist(), logprobs.tolist(), strict=True))


def _shared_rows(inputs: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct inputs in first-seen order, and for each input the index of its distinct one."""
    first: dict[tuple[int, ...], int] = {}
    unique: list[list[int]] = []
    rows: list[int] = []
    for x in inputs:
        if (key := tuple(x)) not in first:
            first[key] = len(unique)
            unique.append(x)
        rows.append(first[key])
    return unique, rows


def _avoid_per_shape_attention_plans() -> None:
    """Decoding grows the KV length by one each step and the batch changes as requests come and go, so nearly every
    attention call has a shape not seen before. On an H100 (2026-11-28, bench/engine_bench.py --device cuda) a batch
    of 8 decoded 160 tokens at 132 tok/s the first time and at ~1,230 tok/s over the same shapes again: ~60 ms of a
    ~66 ms step went to first-seen shapes. cuDNN's attention builds an execution plan per shape, the likely cost;
    the other SDPA kernels (flash, memory-efficient, math) need none, so cuDNN's is left out of this process. Not
    yet confirmed on a GPU: `ENGINE_BENCH=1 scripts/gpu/lane.sh` on the next one lent shows both figures."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def _one_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]


def _trim_heap() -> None:
    """Ask glibc to hand freed heap pages back to the OS (so the release shows in RSS); a no-op elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
