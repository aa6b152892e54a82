"""Partial-rollout carry-over (issue 17, algorithm.partialRollout): how a step's unfinished requests outlive it.

With partial rollout a step's stream ends once it has its target groups; the requests still generating are not
thrown away but carried, with their tokens, into the next step, which continues them under its own weight version
(a running one once its worker flushed it). A response then holds tokens of several versions: each run of tokens
is marked with its version (`switch_version`), and its trajectory says which (`version_spans`), so the trainer can
weigh them. Finished carried responses are delivered on the stream of the step that continued them
(`delivery_step`).

`CarryOver` owns the carried requests, those that finished meanwhile and the stream each re-homed one goes to; the
lifecycle (lifecycle.py) hands it every finished trajectory (`deliver`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable

from rlboost.policies.migration import MigrationReason
from rlboost.wire.rollout_io import RolloutRequest, Trajectory, request_id

from . import metrics
from .book import RequestBook
from .effects import Effects
from .leases import Leases
from .records import Phase, Request

# the state machine's one logger: its lines keep the name they had before ManagerState was split into modules
log = logging.getLogger("rollout_manager.state")


class CarryOver:
    """The requests carried from a step whose stream ended into the next. Single-threaded, like the state."""

    def __init__(self, book: RequestBook, effects: Effects, leases: Leases) -> None:
        self.book, self.effects, self.leases = book, effects, leases
        # requests of a step whose stream ended at its target, kept for the next step (running on under their
        # version meanwhile); those that finished meanwhile; the stream a re-homed one goes to
        self._carried: dict[str, Request] = {}
        self._carried_done: dict[str, Trajectory] = {}
        self._delivered_to: dict[str, int] = {}
        self.carried_total = 0  # requests carried into a later step, since start

    def carry_step(self, step: int, late: Iterable[Trajectory] = ()) -> int:
        """The step's stream ended at its target: its unfinished requests are kept, with their tokens, for the next
        step to continue under its version (meanwhile they go on under theirs), and so are `late` ones, finished
        but not sent before the stream ended. Returns how many requests are carried."""
        for traj in late:
            self._carried_done[traj.request_id] = traj
        ids = self.book.steps.pop(step, set())
        for rid in ids:
            if (req := self.book.requests.get(rid)) is not None:
                self._carried[rid] = req
        self.carried_total += len(ids)
        metrics.CARRIED.inc(len(ids))
        self.effects.dirty = True
        return len(ids)

    def delivery_step(self, traj: Trajectory) -> int:
        """The step whose stream delivers a trajectory `take_delivered` gave (once per trajectory): a carried
        request's is the step that continued it, not its own."""
        return self._delivered_to.pop(traj.request_id, traj.step)

    def deliver(self, req: Request, traj: Trajectory) -> None:
        """The request finished: its trajectory goes to its stream, or waits for the next step if it is carried."""
        if self._carried.pop(req.id, None) is not None:  # finished between its step's end and the next step
            self._carried_done[req.id] = traj
            return
        if req.stream is not None:
            self._delivered_to[req.id] = req.stream
        self.effects.deliver(traj)

    def forget(self, rid: str) -> None:
        """The request is gone (it failed): no later step continues it."""
        self._carried.pop(rid, None)

    def withdraw(self, rid: str) -> None:
        """The request's step was sent again: what was carried or kept of it is no longer waited for."""
        self._carried.pop(rid, None)
        self._carried_done.pop(rid, None)
        self._delivered_to.pop(rid, None)

    def continue_step(self, r: RolloutRequest, ids: set[str], received: set[str], now: float) -> int:
        """Take the earlier steps' samples the trainer still waits for (r.carried) into step r.step: continued under
        r's version from the tokens kept, delivered at once if they finished meanwhile, or generated afresh when
        none were kept. Carried requests a partial step (target_groups > 0) does not list are dropped: the trainer
        no longer waits for them (another call, an evaluation's, leaves them be). Returns how many the step yields."""
        if not (r.carried or (r.target_groups and (self._carried or self._carried_done))):
            return 0
        wanted = {request_id(c.step, c.prompt_index, g): (c, g) for c in r.carried for g in c.sample_indices}
        if r.target_groups:
            for rid in [rid for rid in self._carried if rid not in wanted]:
                del self._carried[rid]
                self.leases.drop(rid, now)
            self.keep_only_done(wanted)
        n, moved = 0, {}  # re-homed pending request -> the version whose queue it left
        for rid, (c, g) in wanted.items():
            if rid in received:
                continue
            if (done := self._carried_done.pop(rid, None)) is not None:
                self.effects.deliver(done)
                self._delivered_to[rid] = r.step
            elif (req := self._carried.pop(rid, None)) is not None:
                if (old := self._rehome(req, r.weight_version, now)) is not None:
                    moved[rid] = old
                req.stream = r.step
                ids.add(rid)
            elif rid not in self.book.requests:  # nothing kept (a restarted manager, a resumed trainer): afresh
                req = self.book.new_request(r, c.step, c.prompt_index, g, c.prompt_ids, now)
                req.stream = r.step
                self.book.enqueue(req)
                ids.add(rid)
            else:
                log.warning("carried request is another step's: skipped", extra={"request_id": rid, "step": r.step})
                continue
            n += 1
        for version in set(moved.values()):  # out of their old version's queue (one pass per version)
            self.book.pending[version] = deque(rid for rid in self.book.pending.get(version, ()) if rid not in moved)
        return n

    # ---- agentic episodes (episode_carry.py): an episode is carried whole; these keep its trajectory and stream --

    def keep_done(self, traj: Trajectory) -> None:
        """A carried episode finished: it waits for the step that lists it next."""
        self._carried_done[traj.request_id] = traj

    def deliver_to(self, traj: Trajectory, step: int) -> None:
        """The trajectory goes out on step `step`'s stream (a later one than its own)."""
        self._delivered_to[traj.request_id] = step
        self.effects.deliver(traj)

    def take_done(self, rid: str) -> Trajectory | None:
        """The carried one of this id that finished meanwhile, if any (it leaves the carry)."""
        return self._carried_done.pop(rid, None)

    def keep_only_done(self, wanted: Iterable[str]) -> None:
        """A partial step listed what it waits for: the finished carried ones it does not list are dropped."""
        keep = set(wanted)
        self._carried_done = {rid: t for rid, t in self._carried_done.items() if rid in keep}

    def rehome_one(self, req: Request, version: int, now: float) -> None:
        """`req` (a carried episode's model turn) goes on under `version`, leaving its old version's queue."""
        if (old := self._rehome(req, version, now)) is not None:
            self.book.pending[old] = deque(rid for rid in self.book.pending.get(old, ()) if rid != req.id)

    def _rehome(self, req: Request, version: int, now: float) -> int | None:
        """Continue a carried request under `version`: a pending one now (its old version returned: it must leave
        that queue), a running one once its worker flushed it (revoked with reason 'carried')."""
        if req.weight_version == version:
            return None
        req.next_version = version
        if req.phase is Phase.PENDING:
            old = req.weight_version
            self.book.pending_count[old] -= 1
            switch_version(req)
            self.book.queue(version).appendleft(req.id)
            self.book.pending_count[version] += 1
            return old
        if req.phase is Phase.RUNNING:
            self.leases.revoke(req.id, MigrationReason.REVOKED, now, wire_reason="carried")
        return None


def switch_version(req: Request) -> None:
    """The carried request goes on under req.next_version: the tokens from here on are marked with it."""
    version, req.next_version = req.next_version, None
    if version is None or version == req.weight_version:
        return
    if not req.marks:
        req.marks.append((0, req.weight_version))
    if req.marks[-1][0] == len(req.tokens):  # no token came under the previous version
        req.marks.pop()
    req.marks.append((len(req.tokens), version))
    req.weight_version = version


def version_spans(req: Request) -> tuple[int, list[tuple[int, int]]]:
    """(oldest version, [(version, tokens), ...]) of the response; the spans are empty when it has one version."""
    n = len(req.tokens)
    if not req.marks:
        return req.weight_version, []
    bounds = [*(start for start, _ in req.marks[1:]), n]
    spans = [(v, min(end, n) - start) for (start, v), end in zip(req.marks, bounds, strict=True) if min(end, n) > start]
    if not spans:
        return req.weight_version, []
    return spans[0][0], spans if len(spans) > 1 else []
