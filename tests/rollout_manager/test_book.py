"""RequestBook alone: new requests continue a dropped id's leases, the kept epochs are bounded, and the pending
queue readers skip stale entries, place an id queued twice once, and keep a request off a worker it failed on."""

from __future__ import annotations

from rlboost.wire.rollout_io import PromptItem, RolloutRequest, SamplingParams
from rollout_manager import book as book_module
from rollout_manager.book import RequestBook
from rollout_manager.records import Phase

STEP = RolloutRequest(3, 1, [PromptItem(0, [9, 9])], 2, SamplingParams(max_new_tokens=4, seed=5), vocab_size=50)


def _new(book: RequestBook, sample: int, step: int = 3):
    req = book.new_request(STEP, step, 0, sample, [9, 9], now=1.0)
    book.enqueue(req)
    return req


def test_a_new_request_gets_its_sample_seed_and_a_dropped_id_continues_its_leases():
    book = RequestBook()
    req = _new(book, 0)
    assert (req.id, req.weight_version, req.vocab_size, req.lease_epoch) == ("s3-p0-g0", 1, 50, 0)
    assert req.sampling.seed != STEP.sampling.seed and req.sampling.max_new_tokens == 4
    req.lease_epoch = 3
    assert book.forget(req.id) is req and req.id not in book.requests and book.forget(req.id) is None
    assert _new(book, 0).lease_epoch == 3  # the step sent again: a late chunk of the dropped lease stays stale
    assert book.dropped_epochs == {}


def test_the_kept_epochs_are_bounded_and_the_oldest_forgotten(monkeypatch):
    monkeypatch.setattr(book_module, "MAX_DROPPED_EPOCHS", 2)
    book = RequestBook()
    for step in range(3):
        book.forget(_new(book, 0, step=step).id)
    assert list(book.dropped_epochs) == ["s1-p0-g0", "s2-p0-g0"]


def test_pending_readers_skip_stale_ids_and_take_an_id_queued_twice_once():
    book = RequestBook()
    a, b = _new(book, 0), _new(book, 1)
    book.queue(1).append(a.id)  # queued again (a step sent again)
    book.queue(1).appendleft("s9-p0-g0")  # a dropped request's entry
    assert book.pending_total == 2
    assert [r.id for r in book.take_pending(book.queue(1), 5)] == [a.id, b.id] and not book.queue(1)


def test_pop_pending_keeps_a_request_off_the_worker_it_failed_on_while_another_may_take_it():
    book = RequestBook()
    a, b = _new(book, 0), _new(book, 1)
    a.failed_on.add("w1")
    queue = book.queue(1)
    assert book.pop_pending(queue, "w1", lambda: 2) is b and list(queue) == [a.id]  # skipped, kept in order
    assert book.pop_pending(queue, "w1", lambda: 1) is a  # no other worker: it goes where it failed


def test_close_takes_the_request_off_its_stream_and_an_emptied_step_goes():
    book = RequestBook()
    a, b = _new(book, 0), _new(book, 1)
    book.steps[3] = {a.id, b.id}
    b.stream, b.phase = 4, Phase.FINISHED  # carried into step 4: its stream's list is 4's
    book.steps[4] = {b.id}
    book.close(b)
    assert book.steps == {3: {a.id, b.id}}
    book.close(a)
    assert book.steps == {3: {b.id}}
