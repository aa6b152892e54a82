"""A micro-batch's forward with each distinct prompt computed once (trainer.sharePrompts, on by default).

A GRPO group's samples all carry the same prompt, so a plain forward of a micro-batch computes every prompt G
times. Here each distinct prompt goes through the model once, in one of two ways:

- *packed* (`pack`, while the micro-batch's mask stays under PACK_MAX_MASK elements: short rows): one row per
  distinct prompt holds the prompt and then each of its samples' responses, a 4D attention mask keeping every
  response to its prompt and itself and the position ids continuing the prompt's; one pass through the model. Needs
  an attention that takes a custom 4D mask (SDPA, eager); others take the two passes.
- *cached* (`cached_forward`: longer rows, where a packed row's attention over every response of its group would
  cost more than a second pass): the distinct prompts once with a KV cache, the cache indexed out to every row
  (`index_select`: its backward sums each row's gradient into its prompt's), then each row's response against it.

The logits come out in *response coordinates*: [B, T + 1, V] for rows of at most T response tokens, position j
predicting response token j (position 0 is the prompt's last logit). `view` puts the micro-batch's per-target
tensors in the same coordinates, so the loss code reads them unchanged (a masked-out target weighs nothing in any
aggregation, so dropping the prompt's targets changes no loss and no gradient).

The same arithmetic as the plain forward up to float rounding (a distinct matmul shape sums in another order:
~1e-6 on log-probs), with fewer FLOPs: on the default job a micro-batch of 4 prompts x 8 samples of 24 + 3 tokens
runs 192 positions instead of 864. The logits held are the responses' only, not the prompts' (B x L x V in the
plain forward: gigabytes with long prompts and a large vocabulary).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from trainer.grpo import MicroBatch


@dataclass(frozen=True)
class SharedPrompts:
    """How a micro-batch's rows map onto its distinct prompts (U of them) and their responses."""

    prompts: torch.Tensor  # [U, P] int64: the distinct prompts, right-padded
    prompt_mask: torch.Tensor  # [U, P] int64: 1 on a prompt's tokens
    last: torch.Tensor  # [U] int64: each prompt's last position (its logit predicts the first response token)
    of_row: torch.Tensor  # [B] int64: each row's prompt, an index into `prompts`
    starts: torch.Tensor  # [B] int64: each row's prompt length (where its response starts)
    responses: torch.Tensor  # [B, T] int64: each row's tokens after its prompt, right-padded
    response_mask: torch.Tensor  # [B, T] int64: 1 on a row's response tokens


def plan(batch: MicroBatch) -> SharedPrompts | None:
    """The sharing of a micro-batch, or None when no two rows share a prompt (or the batch says no lengths)."""
    if batch.prompt_lengths is None:
        return None
    lengths = batch.prompt_lengths.tolist()
    ids = batch.input_ids.tolist()
    index: dict[tuple[int, ...], int] = {}
    of_row = [index.setdefault(tuple(row[:p]), len(index)) for row, p in zip(ids, lengths, strict=True)]
    if len(index) == len(ids):
        return None
    return _layout(batch, list(index), of_row, lengths)


def _layout(batch: MicroBatch, prompts: list[tuple[int, ...]], of_row: list[int], lengths: list[int]) -> SharedPrompts:
    width = max(len(p) for p in prompts)
    device = batch.input_ids.device
    ends = batch.attention_mask.sum(dim=1)
    starts = torch.tensor(lengths, dtype=torch.int64, device=device)
    sizes = ends - starts
    t = max(int(sizes.max().item()), 1)
    cols = starts[:, None] + torch.arange(t, device=device)[None, :]
    inside = torch.arange(t, device=device)[None, :] < sizes[:, None]
    responses = batch.input_ids.gather(1, cols.clamp(max=batch.input_ids.shape[1] - 1)) * inside
    return SharedPrompts(
        prompts=torch.tensor([list(p) + [0] * (width - len(p)) for p in prompts], dtype=torch.int64, device=device),
        prompt_mask=torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts], device=device),
        last=torch.tensor([len(p) - 1 for p in prompts], dtype=torch.int64, device=device),
        of_row=torch.tensor(of_row, dtype=torch.int64, device=device),
        starts=starts,
        responses=responses,
        response_mask=inside.to(torch.int64),
    )


def view(batch: MicroBatch, shared: SharedPrompts) -> MicroBatch:
    """The micro-batch in response coordinates: input_ids [B, T + 1] (a placeholder, then the responses), its
    per-target tensors [B, T] read at each row's response targets (prompt length - 1 + j), 0 past a row's end."""
    t = shared.responses.shape[1]
    cols = (shared.starts[:, None] - 1 + torch.arange(t, device=shared.starts.device)[None, :]).clamp(
        max=batch.response_mask.shape[1] - 1
    )
    inside = shared.response_mask.to(batch.response_mask.dtype)
    ones = torch.ones_like(shared.starts)[:, None]
    return replace(
        batch,
        input_ids=torch.cat([ones, shared.responses], dim=1),
        attention_mask=torch.cat([ones, shared.response_mask], dim=1),
        response_mask=batch.response_mask.gather(1, cols) * inside,
        old_logprobs=batch.old_logprobs.gather(1, cols) * inside,
        prompt_lengths=None,
    )


def forward(model: torch.nn.Module, shared: SharedPrompts) -> torch.Tensor:
    """[B, T + 1, V] logits in response coordinates: packed into one pass when small enough (`pack`), else the
    distinct prompts once and then every row's response against its prompt's KV cache (`cached_forward`)."""
    mask_kind = _custom_mask_kind(model)
    packed = pack(shared) if mask_kind else None
    if packed is None:
        return cached_forward(model, shared)
    b, t = shared.responses.shape

    def at_logits(x: torch.Tensor) -> torch.Tensor:  # [U, L, d] -> [B, T + 1, d]: only response coordinates
        return x.reshape(-1, x.shape[-1]).index_select(0, packed.logit_at).reshape(b, t + 1, x.shape[-1])

    mask = packed.mask if mask_kind == "bool" else _additive(packed.mask, model)
    with head_rows(model, at_logits):
        out = model(input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids)
    return out.logits


def cached_forward(model: torch.nn.Module, shared: SharedPrompts) -> torch.Tensor:
    """`forward` in two passes: the distinct prompts once, with a KV cache, then every row's response against its
    prompt's cache. Only the prompts' last positions go through the LM head, once per row (`head_rows`)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    keep = torch.unique(shared.last)
    with head_rows(model, lambda x: x.index_select(0, shared.of_row)):
        first = model(
            input_ids=shared.prompts,
            attention_mask=shared.prompt_mask,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
    rows = torch.arange(len(shared.of_row), device=keep.device)
    last_logits = first.logits[rows, torch.searchsorted(keep, shared.last.index_select(0, shared.of_row))]  # [B, V]
    for layer in cache.layers:  # each row's copy of its prompt's keys and values
        layer.keys = layer.keys.index_select(0, shared.of_row)
        layer.values = layer.values.index_select(0, shared.of_row)
    t = shared.responses.shape[1]
    with head_rows(model, None):
        second = model(
            input_ids=shared.responses,
            attention_mask=torch.cat([shared.prompt_mask.index_select(0, shared.of_row), shared.response_mask], dim=1),
            position_ids=shared.starts[:, None] + torch.arange(t, device=keep.device)[None, :],
            past_key_values=cache,
            use_cache=True,
        )
    return torch.cat([last_logits[:, None, :], second.logits], dim=1)


PACK_MAX_MASK = 1 << 22  # mask elements (U x L x L) up to which a micro-batch is packed (4 MB as bool): short rows,
# where a pass's fixed cost dominates; past it the two passes' attention (each row over its prompt) does less work


@dataclass(frozen=True)
class Packed:
    """A micro-batch as one row per distinct prompt: the prompt, then each of its samples' responses in turn."""

    input_ids: torch.Tensor  # [U, L] int64
    position_ids: torch.Tensor  # [U, L] int64: a response's positions continue its prompt's
    mask: torch.Tensor  # [U, 1, L, L] bool: a prompt token sees its prompt, a response token its prompt and itself
    logit_at: torch.Tensor  # [B * (T + 1)] int64: the position in [U * L] of each response coordinate's logit


def pack(shared: SharedPrompts) -> Packed | None:
    """The packed layout of a micro-batch (None when its mask would pass PACK_MAX_MASK). One pass instead of two,
    so fewer operators: on the default job's micro-batch 11.9 ms of CPU against 16.3 (one thread)."""
    u, b, t = shared.prompts.shape[0], *shared.responses.shape
    dev = shared.prompts.device
    rlen = shared.response_mask.sum(dim=1)
    same = shared.of_row[:, None] == shared.of_row[None, :]
    earlier = same & (torch.arange(b, device=dev)[None, :] < torch.arange(b, device=dev)[:, None])
    start = shared.starts + (earlier * rlen[None, :]).sum(dim=1)  # [B]: after the prompt and its earlier rows
    ends = shared.prompt_mask.sum(dim=1).index_add(0, shared.of_row, rlen)  # each prompt's row: itself, its responses
    width = int(ends.max().item())
    if u * width * width > PACK_MAX_MASK:
        return None
    p = shared.prompts.shape[1]
    ids = torch.zeros(u, width, dtype=torch.int64, device=dev)
    ids[:, :p] = shared.prompts
    positions = torch.arange(width, device=dev).repeat(u, 1)
    segment = torch.full((u, width), -2, dtype=torch.int64, device=dev)  # -1 prompt, b row b's response, -2 none
    segment[:, :p] = torch.where(shared.prompt_mask > 0, -1, -2)
    j = torch.arange(t, device=dev)[None, :]
    inside = shared.response_mask > 0
    flat = (shared.of_row[:, None] * width + start[:, None] + j)[inside]
    ids.view(-1)[flat] = shared.responses[inside]
    positions.view(-1)[flat] = (shared.starts[:, None] + j).expand(b, t)[inside]
    segment.view(-1)[flat] = torch.arange(b, device=dev)[:, None].expand(b, t)[inside]
    last = shared.of_row * width + shared.last.index_select(0, shared.of_row)
    after = shared.of_row[:, None] * width + start[:, None] + j  # the logit after response token j
    logit_at = torch.cat([last[:, None], torch.where(j < rlen[:, None], after, last[:, None])], dim=1)
    return Packed(ids, positions, _packed_mask(segment), logit_at.reshape(-1))


def _packed_mask(segment: torch.Tensor) -> torch.Tensor:
    """[U, 1, L, L]: causal, a key of the query's own segment or of the prompt; a position of no segment sees only
    itself (a query that sees nothing would make the attention NaN, and its gradient everyone's)."""
    width = segment.shape[1]
    q, k = segment[:, :, None], segment[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool, device=segment.device).tril()
    sees = causal & ((k == q) | (k == -1)) & (k != -2)
    return (sees | torch.eye(width, dtype=torch.bool, device=segment.device))[:, None]


def _custom_mask_kind(model: torch.nn.Module) -> str:
    """How the model's attention takes a custom 4D mask: "bool" (SDPA), "additive" (eager), "" (others: flash
    attention takes none, flex attention another form; those compute the two passes)."""
    config = getattr(getattr(model, "module", model), "config", None)
    return {"sdpa": "bool", "eager": "additive"}.get(getattr(config, "_attn_implementation", ""), "")


def _additive(mask: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    dtype = next(model.parameters()).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


MIN_HEAD_ROWS = 4  # below 4 rows the CPU matmul takes another kernel: other bits, and with an odd vocabulary
# (the default job's 283) bits that depend on the thread count (2026-11-28, torch 2.13.0 CPU, AVX2)


@contextlib.contextmanager
def head_rows(model: torch.nn.Module, select: Callable[[torch.Tensor], torch.Tensor] | None) -> Iterator[None]:
    """While set, the LM head's input is `select`ed first (None: as is; e.g. each row's copy of its prompt's last
    position) and padded with zero rows to at least MIN_HEAD_ROWS positions (the padding cut from its output): each
    logit is then the product a whole row's plain forward computes, whatever the number of distinct prompts and the
    number of threads."""
    head = getattr(model, "module", model).get_output_embeddings()
    count: list[int] = []

    def before(_module: torch.nn.Module, args: tuple) -> tuple:
        x = args[0] if select is None else select(args[0])
        count.append(x.shape[0])
        per_row = max(1, x[0].numel() // x.shape[-1])  # positions per row
        pad = max(0, -(-MIN_HEAD_ROWS // per_row) - x.shape[0])
        return (torch.cat([x, x.new_zeros((pad, *x.shape[1:]))]) if pad else x,)

    def after(_module: torch.nn.Module, _args: tuple, out: torch.Tensor) -> torch.Tensor:
        return out[: count[-1]]

    handles = [head.register_forward_pre_hook(before), head.register_forward_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def to_targets(values: torch.Tensor, shared: SharedPrompts, width: int) -> torch.Tensor:
    """[B, width] a [B, T] response-coordinate tensor put back at each row's targets (prompt length - 1 + j), 0
    elsewhere. scatter_add: the clamped columns past a row's end add exact zeros, never overwrite a value."""
    t = values.shape[1]
    cols = (shared.starts[:, None] - 1 + torch.arange(t, device=values.device)[None, :]).clamp(max=width - 1)
    inside = shared.response_mask.to(values.dtype)
    return torch.zeros(values.shape[0], width, dtype=values.dtype, device=values.device).scatter_add(
        1, cols, values * inside
    )
