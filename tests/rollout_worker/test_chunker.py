"""Chunk batching bounded in tokens and milliseconds (pure logic)."""

from __future__ import annotations

import pytest

from rollout_worker.chunker import Chunker


def test_chunk_leaves_when_full_and_offsets_continue():
    c = Chunker(max_tokens=3, max_ms=50)
    c.open("r", lease_epoch=2, offset=4)
    c.add("r", [1, 2], [-0.1, -0.2], now_ms=0)
    assert c.due(10) == []
    c.add("r", [3, 4, 5, 6, 7], [-0.3] * 5, now_ms=10)
    chunks = c.due(10)  # everything buffered leaves, in chunks of at most max_tokens
    assert [(ch.offset, ch.token_ids) for ch in chunks] == [(4, [1, 2, 3]), (7, [4, 5, 6]), (10, [7])]
    assert all(ch.lease_epoch == 2 and not ch.finished for ch in chunks)
    assert c.pending_tokens() == 0
    c.add("r", [8], [-0.1], now_ms=11)
    c.add("r", [9, 10], [-0.1, -0.1], now_ms=12)
    (chunk,) = c.due(12)
    assert (chunk.offset, chunk.token_ids) == (11, [8, 9, 10])  # full: leaves at once


def test_a_due_request_takes_every_other_requests_tokens_along():
    """One ChunkBatch carries every running request's tokens (the manager pays per message), not only the due one's."""
    c = Chunker(max_tokens=4, max_ms=50)
    for rid in ("a", "b", "c"):
        c.open(rid, 0, 0)
    c.add("a", [1], [-1.0], now_ms=0)
    c.add("b", [2, 3], [-1.0] * 2, now_ms=30)
    assert c.due(49) == []  # nothing due yet: nothing leaves
    chunks = c.due(50)  # "a" aged; "b" (20 ms old) goes with it; "c" has nothing
    assert {ch.request_id: ch.token_ids for ch in chunks} == {"a": [1], "b": [2, 3]}
    assert c.next_deadline() is None and c.pending_tokens() == 0


def test_set_bounds_moves_the_deadline_and_the_token_bound():
    c = Chunker(max_tokens=4, max_ms=50)
    c.open("r", 0, 0)
    c.add("r", [1], [-1.0], now_ms=100)
    c.set_bounds(max_tokens=8, max_ms=500)
    assert c.next_deadline() == 600
    c.add("r", [2, 3, 4], [-1.0] * 3, now_ms=200)
    assert c.due(599) == []  # 4 tokens no longer fill a chunk, 499 ms is not old
    (chunk,) = c.due(600)
    assert chunk.token_ids == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="max_ms=0"):
        c.set_bounds(8, 0)


def test_chunk_leaves_when_old():
    c = Chunker(max_tokens=16, max_ms=50)
    c.open("r", 0, 0)
    c.add("r", [1], [-1.0], now_ms=100)
    assert c.next_deadline() == 150
    assert c.due(149) == []
    (chunk,) = c.due(150)
    assert chunk.token_ids == [1] and chunk.offset == 0
    assert c.next_deadline() is None


def test_end_carries_the_reason_on_the_last_chunk():
    c = Chunker(max_tokens=2, max_ms=50)
    c.open("done", 0, 0)
    c.add("done", [1, 2], [-1.0, -1.0], now_ms=0)
    c.end("done", True, "stop")
    c.open("moved", 0, 5)
    c.end("moved", False, "abort")
    chunks = {ch.request_id: ch for ch in c.due(0)}
    assert chunks["done"].token_ids == [1, 2] and chunks["done"].finished and chunks["done"].finish_reason == "stop"
    moved = chunks["moved"]
    assert moved.token_ids == [] and moved.offset == 5 and not moved.finished and moved.finish_reason == "abort"
    assert len(c) == 0


def test_flush_all_sends_partial_chunks():
    c = Chunker(max_tokens=8, max_ms=1000)
    c.open("r", 0, 0)
    c.add("r", [1, 2], [-1.0, -1.0], now_ms=0)
    (chunk,) = c.due(1, flush_all=True)
    assert chunk.token_ids == [1, 2]


def test_bounds_must_be_positive():
    with pytest.raises(ValueError, match="max_tokens"):
        Chunker(0, 10)
