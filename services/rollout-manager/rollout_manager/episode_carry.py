"""Partial rollout for agentic episodes (algorithm.partialRollout with task.environment): a step's stream ends at
its target groups of episodes, and its episodes still running are carried whole into a later step.

A carried episode is not stopped: its env-runner keeps driving it (its environment's state lives there), and its
turns go on under its version until a step lists it (RolloutRequest.carried). That step continues it under the
step's version: its next turns are asked at that version, and a turn generating at that moment is re-homed as a
carried single-turn response is (a pending one at once, a running one after its worker flushed it, revoke reason
`carried`), so no token is regenerated and every model token keeps the version that sampled it (the turn's
version spans; the env-runner's transcript joins them into the episode's). It is then delivered on that step's
stream. One that finished meanwhile is delivered at once; one that failed meanwhile fails that step (with
rollout.onFailedRequest 'fail'); one the manager does not hold (it restarted) starts afresh from its task. A partial
step that does not list a carried episode drops it (the trainer no longer waits for it): its runner is told.

The trajectories and streams of carried episodes are kept by CarryOver (carry_over.py), as single-turn ones are.
"""

from __future__ import annotations

import logging

from rlboost.wire.rollout_io import CarriedGroup, RolloutRequest, request_id

from .book import RequestBook
from .carry_over import CarryOver
from .episodes import Episode, Episodes

log = logging.getLogger("rollout_manager.episodes")


class EpisodeCarry:
    """Carries a step's episodes past its stream's end and hands them to the step that lists them."""

    def __init__(self, episodes: Episodes, carry: CarryOver, book: RequestBook) -> None:
        self.episodes, self.carry, self.book = episodes, carry, book

    def carry_step(self, step: int) -> int:
        """The step's stream ended at its target: its episodes still running are carried. Returns how many."""
        held = [self.episodes.episodes.get(eid) for eid in self.book.steps.get(step, ())]
        for ep in held:
            if ep is not None:
                ep.carried = True
        return sum(ep is not None for ep in held)

    def continue_step(self, r: RolloutRequest, ids: set[str], received: set[str], now: float) -> int:
        """Take the episodes r.carried lists into step r.step (their ids added to `ids` where the step still waits
        for them). Returns how many the step yields."""
        if not (r.carried or r.target_groups):
            return 0
        wanted = {request_id(c.step, c.prompt_index, g): (c, g) for c in r.carried for g in c.sample_indices}
        if r.target_groups:
            self._drop_unlisted(wanted, now)
        n = 0
        for eid, (c, g) in wanted.items():
            if eid not in received and self._take(r, eid, c, g, ids, now):
                n += 1
        return n

    def _take(self, r: RolloutRequest, eid: str, c: CarriedGroup, g: int, ids: set[str], now: float) -> bool:
        if (why := self.episodes.carried_failures.pop(eid, None)) is not None:
            self.episodes.effects.fail_step(r.step, why)
        elif (done := self.carry.take_done(eid)) is not None:
            self.carry.deliver_to(done, r.step)
        elif (ep := self.episodes.episodes.get(eid)) is None:  # nothing held (a restarted manager): afresh
            self.episodes.new_episode(r, c.step, c.prompt_index, g, c.task_json, now).stream = r.step
            ids.add(eid)
        elif ep.carried:
            self._go_on(ep, r, now)
            ids.add(eid)
        else:
            log.warning("carried episode is another step's: skipped", extra={"episode_id": eid, "step": r.step})
            return False
        return True

    def _go_on(self, ep: Episode, r: RolloutRequest, now: float) -> None:
        """The carried episode is the step's now, under its version: its next turns, and the turn generating now
        from its next token on."""
        ep.carried, ep.stream = False, r.step
        if ep.version == r.weight_version:
            return
        ep.version = r.weight_version
        if ep.turn is not None and (turn := self.book.requests.get(ep.turn)) is not None:
            self.carry.rehome_one(turn, r.weight_version, now)

    def _drop_unlisted(self, wanted: dict, now: float) -> None:
        """A partial step lists every carried episode the trainer waits for: the others go."""
        gone = {eid for eid, ep in self.episodes.episodes.items() if ep.carried and eid not in wanted}
        if gone:
            log.info("carried episodes no longer waited for: dropped", extra={"episodes": len(gone)})
            self.episodes.cancel(gone, now)
        self.carry.keep_only_done(wanted)
        for eid in [eid for eid in self.episodes.carried_failures if eid not in wanted]:
            del self.episodes.carried_failures[eid]
