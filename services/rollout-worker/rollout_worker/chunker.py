"""Token chunk batching: a worker's tokens leave once a request holds `max_tokens` or waited `max_ms` milliseconds.

Pure logic, no I/O: the session adds engine steps, asks what is due (`due(now_ms)`), and sends every due
chunk of the worker in one ChunkBatch. When anything is due, every request's buffered tokens leave with it:
the manager pays per message far more than per token, so one message carries all the worker has. Offsets are
response indices, so the manager can place tokens exactly and discard duplicates. The bounds can change while
requests run (`set_bounds`: the manager's load-adaptive cadence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.wire.rollout_io import TokenChunk


@dataclass
class _Buffer:
    lease_epoch: int
    offset: int  # response index of tokens[0]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    since_ms: int | None = None  # when the oldest unsent token arrived
    end: tuple[bool, str] | None = None  # (finished, finish_reason) once the request's stream ended
    error: str = ""  # the request failed here by itself (sent on its last chunk)
    invalid_input: bool = False  # ... because its input is refused


class Chunker:
    """Buffers tokens per request and cuts them into chunks bounded in tokens and in time."""

    def __init__(self, max_tokens: int, max_ms: int) -> None:
        if max_tokens <= 0 or max_ms <= 0:
            raise ValueError(f"chunk bounds must be > 0, got max_tokens={max_tokens}, max_ms={max_ms}")
        self.max_tokens, self.max_ms = max_tokens, max_ms
        self._buffers: dict[str, _Buffer] = {}

    def set_bounds(self, max_tokens: int, max_ms: int) -> None:
        """New bounds from now on (tokens already buffered keep their age and leave by the new bounds)."""
        if max_tokens <= 0 or max_ms <= 0:
            raise ValueError(f"chunk bounds must be > 0, got max_tokens={max_tokens}, max_ms={max_ms}")
        self.max_tokens, self.max_ms = max_tokens, max_ms

    def open(self, request_id: str, lease_epoch: int, offset: int) -> None:
        """Start buffering a request whose next token has response index `offset`."""
        self._buffers[request_id] = _Buffer(lease_epoch, offset)

    def add(self, request_id: str, tokens: list[int], logprobs: list[float], now_ms: int) -> bool:
        """Buffer a request's new tokens; True when they start its age clock (the flush deadline may be earlier)."""
        buf = self._buffers[request_id]
        started = bool(tokens) and buf.since_ms is None
        if started:
            buf.since_ms = now_ms
        buf.tokens += tokens
        buf.logprobs += logprobs
        return started

    def end(self, request_id: str, finished: bool, reason: str, error: str = "", invalid_input: bool = False) -> None:
        """The request's stream ended; its last chunk carries (finished, reason), and the error of a request that
        failed here by itself, and leaves at the next `due`."""
        buf = self._buffers[request_id]
        buf.end, buf.error, buf.invalid_input = (finished, reason), error, invalid_input

    def pending_tokens(self) -> int:
        return sum(len(b.tokens) for b in self._buffers.values())

    def __len__(self) -> int:
        return len(self._buffers)

    def next_deadline(self) -> int | None:
        """The earliest time (ms) a chunk becomes due by age, or None when nothing waits on time."""
        times = [b.since_ms + self.max_ms for b in self._buffers.values() if b.since_ms is not None]
        return min(times) if times else None

    def due(self, now_ms: int, flush_all: bool = False) -> list[TokenChunk]:
        """Chunks to send now. Nothing until one request is due (full, old or ended) or `flush_all`; then every
        request's buffered tokens, in chunks of at most `max_tokens` (an ended request's last carries its end)."""
        if not (flush_all or any(self._is_due(b, now_ms) for b in self._buffers.values())):
            return []
        out: list[TokenChunk] = []
        for rid, buf in list(self._buffers.items()):
            while len(buf.tokens) > self.max_tokens:
                out.append(self._cut(rid, buf, self.max_tokens, final=False))
            if buf.end is not None:
                out.append(self._cut(rid, buf, len(buf.tokens), final=True))
                del self._buffers[rid]
            elif buf.tokens:
                out.append(self._cut(rid, buf, len(buf.tokens), final=False))
            buf.since_ms = None
        return out

    def _is_due(self, buf: _Buffer, now_ms: int) -> bool:
        aged = buf.since_ms is not None and now_ms - buf.since_ms >= self.max_ms
        return aged or buf.end is not None or len(buf.tokens) >= self.max_tokens

    def _cut(self, rid: str, buf: _Buffer, n: int, final: bool) -> TokenChunk:
        finished, reason = buf.end if final and buf.end else (False, "")
        chunk = TokenChunk(rid, buf.lease_epoch, buf.offset, buf.tokens[:n], buf.logprobs[:n], finished, reason)
        if final:
            chunk.error, chunk.invalid_input = buf.error, buf.invalid_input
        buf.offset += n
        buf.tokens, buf.logprobs = buf.tokens[n:], buf.logprobs[n:]
        return chunk
