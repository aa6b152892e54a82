"""Chaos: kill a process of the chosen roles caught mid-work, at most once per period (pure).

`--chaos-targets` names the roles (spot, reserved, manager, weight-server, nats, trainer; default spot). The
runner sends the signal (SIGKILL, or SIGTERM with `--chaos-signal TERM`), restarts a killed non-spot process
(same ports, same arguments; the trainer with --resume) and replaces a spot worker as a trace would.

A kill is triggered by an event, not by the clock alone: the monkey is *armed* from the start and again
`period_s` after each kill (and only while no killed process is still coming back), and while armed it kills
only a process that the manager's status shows at work:
  * a worker (spot, reserved) holding tokens of a response still running on it (`inflight_tokens > 0`),
  * the manager while any worker streams such tokens to it,
  * the trainer, the weight-server and NATS while a step is rolling out (requests pending or running): the
    trainer waits on that step's trajectories, its next weight version is uploaded to the weight-server and
    pulled from it, its step report goes over NATS.
A kill that lands between responses tests nothing, so the monkey never settles for an idle process; and
because the first kill waits for the first streamed token rather than for a wall-clock time, a fast machine
cannot finish the run before it. Roles take strict turns in the given order (a role with no live process
passes), so every role is hit in a run of enough periods.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rlboost.wire.rollout_io import ManagerStatus

TARGETS = ("spot", "reserved", "manager", "weight-server", "nats", "trainer")
DEFAULT_TARGETS = ("spot",)


def parse_targets(text: str) -> tuple[str, ...]:
    """`spot,nats` -> ("spot", "nats"): known roles, each once, in the given order; ValueError naming the flag."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in TARGETS]
    if not names or unknown:
        what = f"unknown {', '.join(map(repr, unknown))}" if unknown else "empty"
        raise ValueError(f"--chaos-targets: {what}; give a comma list of {', '.join(TARGETS)}")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Victim:
    """A process caught at work: its role (a chaos target), its child name, and what it was doing."""

    target: str
    name: str
    doing: str


def _step_doing(status: ManagerStatus) -> str:
    streaming = sum(w.inflight_tokens for w in status.workers)
    return f"step rolling out: {status.pending} pending, {status.running} running, {streaming} tokens in flight"


def caught_at_work(target: str, live: list[str], status: ManagerStatus) -> list[Victim]:
    """The live processes of `target` (child names) that the status shows at work, with what they do."""
    if target in ("spot", "reserved"):
        workers = {w.worker_id: w for w in status.workers}
        busy = [n for n in live if n in workers and workers[n].inflight_tokens > 0]
        return [
            Victim(target, n, f"{workers[n].running} running, {workers[n].inflight_tokens} tokens in flight")
            for n in busy
        ]
    streaming = sum(w.inflight_tokens for w in status.workers)
    at_work = streaming > 0 if target == "manager" else status.pending + status.running > 0
    return [Victim(target, n, _step_doing(status)) for n in live] if at_work else []


@dataclass
class ChaosMonkey:
    """Decides when to kill and whom. `armed(now)` says a kill is wanted; `choose`/`pick` pick a victim or wait."""

    period_s: float
    seed: int = 0
    targets: tuple[str, ...] = DEFAULT_TARGETS
    _next_at: float | None = None  # None: armed (the first kill waits only for a victim)
    _turn: int = 0  # index into targets of the role whose turn it is
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError(f"--chaos-kill-every: must be > 0 seconds, got {self.period_s}")
        parse_targets(",".join(self.targets))  # raises naming the flag
        self._rng = random.Random(self.seed)

    def armed(self, now: float) -> bool:
        """True until the first kill, then from `period_s` after each kill until the next."""
        return self._next_at is None or now >= self._next_at

    def fire(self, now: float) -> None:
        """A kill happened: the next one is a full period away (missed periods are not replayed)."""
        self._next_at = now + self.period_s

    def pick(self, live: dict[str, list[str]], status: ManagerStatus | None) -> Victim | None:
        """The process to kill now, or None to wait. `live`: per target, its live child names; `status`: the
        manager's (None: wait, never a blind kill). Roles take strict turns, so a role at work all step long
        (NATS) cannot crowd out one at work only while tokens stream (a worker); a role with no live process
        (a spot pool scaled to 0) passes its turn on."""
        if status is None:
            return None
        n = len(self.targets)
        for k in range(n):
            target = self.targets[(self._turn + k) % n]
            if not live.get(target):
                continue
            caught = caught_at_work(target, sorted(live[target]), status)
            if not caught:
                return None  # its turn: wait until it is caught at work
            self._turn = (self._turn + k + 1) % n
            return self._rng.choice(caught)
        return None
