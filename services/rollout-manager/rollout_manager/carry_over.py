"""Partial-rollout carry-over (issue 17, algorithm.partialRollout): the part of `ManagerState` that lets a step's
unfinished requests outlive it.

With partial rollout a step's stream ends once it has its target groups; the requests still generating are not
thrown away but carried, with their tokens, into the next step, which continues them under its own weight version
(a running one once its worker flushed it). A response then holds tokens of several versions: each run of tokens
is marked with its version, and its trajectory says which (version spans), so the trainer can weigh them. Finished
carried responses are delivered on the stream of the step that continued them (`delivery_step`).

A mixin, not a collaborator: it reads and writes the bookkeeping `ManagerState.__init__` sets up (`requests`,
`_pending`, `_pending_count`, `_steps`, `_delivered`, `_carried`, `_carried_done`, `_delivered_to`,
`carried_total`, `_dropped_epochs`) and calls its transitions (`revoke`, `_drop_request`); `_switch_version` and
`_version_spans` are used by its `_migrate` and `_finish`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable

from rlboost.policies.migration import MigrationReason
from rlboost.wire.rollout_io import (
    CarriedGroup,
    RolloutRequest,
    SamplingParams,
    Trajectory,
    request_id,
    sample_seed,
)

from . import metrics
from .records import Phase, Request

# the state machine's one logger: its lines keep the name they had before ManagerState was split into modules
log = logging.getLogger("rollout_manager.state")


class CarryOver:
    """`ManagerState`'s partial-rollout carry-over (see the module docstring)."""

    def carry_step(self, step: int, late: Iterable[Trajectory] = ()) -> int:
        """The step's stream ended at its target: its unfinished requests are kept, with their tokens, for the next
        step to continue under its version (meanwhile they go on under theirs), and so are `late` ones, finished
        but not sent before the stream ended. Returns how many requests are carried."""
        for traj in late:
            self._carried_done[traj.request_id] = traj
        ids = self._steps.pop(step, set())
        for rid in ids:
            if (req := self.requests.get(rid)) is not None:
                self._carried[rid] = req
        self.carried_total += len(ids)
        metrics.CARRIED.inc(len(ids))
        self.dirty = True
        return len(ids)

    def delivery_step(self, traj: Trajectory) -> int:
        """The step whose stream delivers a trajectory `take_delivered` gave (once per trajectory): a carried
        request's is the step that continued it, not its own."""
        return self._delivered_to.pop(traj.request_id, traj.step)

    def _deliver(self, req: Request, traj: Trajectory) -> None:
        if self._carried.pop(req.id, None) is not None:  # finished between its step's end and the next step
            self._carried_done[req.id] = traj
            return
        if req.stream is not None:
            self._delivered_to[req.id] = req.stream
        self._delivered.append(traj)

    def _continue_carried(self, r: RolloutRequest, ids: set[str], received: set[str], now: float) -> int:
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
                self._drop_request(rid, now)
            self._carried_done = {rid: t for rid, t in self._carried_done.items() if rid in wanted}
        n, moved = 0, {}  # re-homed pending request -> the version whose queue it left
        for rid, (c, g) in wanted.items():
            if rid in received:
                continue
            if (done := self._carried_done.pop(rid, None)) is not None:
                self._delivered.append(done)
                self._delivered_to[rid] = r.step
            elif (req := self._carried.pop(rid, None)) is not None:
                if (old := self._rehome(req, r.weight_version, now)) is not None:
                    moved[rid] = old
                req.stream = r.step
                ids.add(rid)
            elif rid not in self.requests:  # nothing kept (a restarted manager, a resumed trainer): afresh
                self._pending_carried(r, c, g, now)
                ids.add(rid)
            else:
                log.warning("carried request is another step's: skipped", extra={"request_id": rid, "step": r.step})
                continue
            n += 1
        for version in set(moved.values()):  # out of their old version's queue (one pass per version)
            self._pending[version] = deque(rid for rid in self._pending.get(version, ()) if rid not in moved)
        return n

    def _rehome(self, req: Request, version: int, now: float) -> int | None:
        """Continue a carried request under `version`: a pending one now (its old version returned: it must leave
        that queue), a running one once its worker flushed it (revoked with reason 'carried')."""
        if req.weight_version == version:
            return None
        req.next_version = version
        if req.phase is Phase.PENDING:
            old = req.weight_version
            self._pending_count[old] -= 1
            _switch_version(req)
            self._pending.setdefault(version, deque()).appendleft(req.id)
            self._pending_count[version] += 1
            return old
        if req.phase is Phase.RUNNING:
            self.revoke(req.id, MigrationReason.REVOKED, now, wire_reason="carried")
        return None

    def _pending_carried(self, r: RolloutRequest, c: CarriedGroup, g: int, now: float) -> None:
        rid = request_id(c.step, c.prompt_index, g)
        sampling = SamplingParams(
            **{**r.sampling.__dict__, "seed": sample_seed(r.sampling.seed, c.step, c.prompt_index, g)}
        )
        self.requests[rid] = Request(
            id=rid,
            step=c.step,
            prompt_index=c.prompt_index,
            sample_index=g,
            prompt=list(c.prompt_ids),
            sampling=sampling,
            weight_version=r.weight_version,
            pending_since=now,
            vocab_size=r.vocab_size,
            stream=r.step,
            lease_epoch=self._dropped_epochs.pop(rid, 0),
        )
        self._pending.setdefault(r.weight_version, deque()).append(rid)
        self._pending_count[r.weight_version] += 1


def _switch_version(req: Request) -> None:
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


def _version_spans(req: Request) -> tuple[int, list[tuple[int, int]]]:
    """(oldest version, [(version, tokens), ...]) of the response; the spans are empty when it has one version."""
    n = len(req.tokens)
    if not req.marks:
        return req.weight_version, []
    bounds = [*(start for start, _ in req.marks[1:]), n]
    spans = [(v, min(end, n) - start) for (start, v), end in zip(req.marks, bounds, strict=True) if min(end, n) > start]
    if not spans:
        return req.weight_version, []
    return spans[0][0], spans if len(spans) > 1 else []
