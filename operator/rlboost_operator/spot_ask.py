"""How many spot workers a job asks for: a pure, per-job state machine with the time passed in.

Two ways to size the spot Deployment (`rollout.spot.sizing`, default from the operator's settings):

- capacity: the spot nodes that exist decide (spot.desired_spot_replicas): a static or hand-scaled spot pool.
- autoscaler: the spot pool grows on demand (GKE node auto-provisioning or autoscaled spot node pools,
  cluster-autoscaler, Karpenter), possibly from zero nodes. Nodes appear only for pods that wait, so the ask is
  the job's maxReplicas. When some spot pods stay unschedulable longer than `pending_timeout_s` (the cloud
  has no spot capacity, a quota is reached), the ask shrinks to the pods that have a node plus
  `probe_workers` (a pod that keeps the autoscaler trying), and after a back-off (doubling up to
  `retry_backoff_max_s`, reset once an ask is fully scheduled) the maximum is asked for again.

A node with a preemption signal (a provider taint, cordoned, NotReady) shrinks the ask at once in both modes: it
adds no capacity, and its pods do not count as placed. Every ask is clamped to [minReplicas, maxReplicas].
Nothing here talks to a cluster or reads a clock. It lives in the operator, not in rlboost/policies, because it
is about Kubernetes scheduling, which the simulator does not model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rlboost.spec import PoolSpec
from rlboost_operator import spot

# Decision reasons: the Event reason and status.workers.spotReason.
CAPACITY = "SpotScaled"  # sized to the spot nodes present
ASKING = "SpotAskingAutoscaler"  # asking for maxReplicas so the autoscaler provisions nodes
BACKING_OFF = "SpotPendingBackoff"  # shrunk after pods stayed unschedulable; retrying later
VARIANT_LABEL = "rlboost.io/spot-variant"  # a spot variant's pods (children.VARIANT_LABEL)


@dataclass(frozen=True)
class AskSettings:
    """Timing of the autoscaler mode (the operator's RLBOOST_OPERATOR_SPOT_* settings)."""

    pending_timeout_s: float = 600.0
    retry_backoff_s: float = 600.0
    retry_backoff_max_s: float = 3600.0
    probe_workers: int = 1


@dataclass(frozen=True)
class SpotPod:
    """One spot worker pod of a job, as the scheduler left it."""

    node: str | None  # spec.nodeName; None while unscheduled
    unschedulable_since: float | None = None  # PodScheduled=False/Unschedulable since (epoch s), else None
    variant: str = ""  # its spot variant (label rlboost.io/spot-variant); '' for a pool without variants


@dataclass(frozen=True)
class Decision:
    """The spot ask and why (reason: one of the constants above; message: for an Event and the status)."""

    replicas: int
    reason: str
    message: str
    shrunk: bool = False  # this decision started a back-off
    recheck_s: float | None = None  # decide again after this long even if nothing changes (a bound or the retry)


def _clamp(pool: PoolSpec, n: int) -> int:
    return max(pool.min_replicas, min(pool.max_replicas, n))


def _duration(seconds: float) -> str:
    """600 -> '10m', 90 -> '1m30s', 45 -> '45s'."""
    minutes, secs = divmod(int(round(seconds)), 60)
    if not minutes:
        return f"{secs}s"
    return f"{minutes}m{secs}s" if secs else f"{minutes}m"


@dataclass
class SpotAsk:
    """One job's autoscaler-mode state: asking for the maximum, or backing off until `retry_at`."""

    settings: AskSettings = field(default_factory=AskSettings)
    asked_at: float | None = None  # when the current ask for the maximum began (pending time counts from it)
    retry_at: float | None = None  # set while backing off
    backoff_s: float | None = None  # the next back-off; None = settings.retry_backoff_s

    def to_status(self) -> dict[str, Any]:
        """The state as RLJob status.workers.spotAsk (RFC 3339 times), so a new operator or leader goes on with
        the same pending bound and back-off instead of asking for the maximum from scratch."""
        return {
            "askedAt": _iso(self.asked_at),
            "retryAt": _iso(self.retry_at),
            "backoffSeconds": self.backoff_s,
        }

    @classmethod
    def from_status(cls, settings: AskSettings, saved: Mapping[str, Any] | None) -> SpotAsk:
        """The state to_status() wrote (missing or unreadable parts: a fresh start)."""
        saved = saved or {}
        backoff = saved.get("backoffSeconds")
        return cls(
            settings,
            asked_at=_epoch(saved.get("askedAt")),
            retry_at=_epoch(saved.get("retryAt")),
            backoff_s=float(backoff) if isinstance(backoff, int | float) and backoff > 0 else None,
        )

    def decide(self, now: float, pool: PoolSpec, pods: Iterable[SpotPod], doomed_nodes: set[str]) -> Decision:
        """The ask at `now` for the job's spot pods; `doomed_nodes` carry a preemption signal."""
        pods = list(pods)
        doomed = sum(1 for p in pods if p.node in doomed_nodes)
        placed = sum(1 for p in pods if p.node is not None and p.node not in doomed_nodes)
        prefix = ""
        if self.retry_at is not None and now >= self.retry_at:
            self.retry_at, self.asked_at, prefix = None, now, "retrying: "
        if self.retry_at is not None:
            n = _clamp(pool, placed + self.settings.probe_workers)
            wait = _duration(self.retry_at - now)
            message = f"{placed} spot workers placed: asking for {n}, retrying {pool.max_replicas} in {wait}"
            return Decision(n, BACKING_OFF, message, recheck_s=self.retry_at - now)
        if self.asked_at is None:
            self.asked_at = now
        return self._check_pending(now, pool, pods, placed, doomed, prefix)

    def _check_pending(
        self, now: float, pool: PoolSpec, pods: list[SpotPod], placed: int, doomed: int, prefix: str
    ) -> Decision:
        """Asking for the maximum (less the pods on nodes going away): shrink if pods waited past the bound."""
        start = self.asked_at if self.asked_at is not None else now
        waited = [now - max(p.unschedulable_since, start) for p in pods if p.unschedulable_since is not None]
        n = _clamp(pool, pool.max_replicas - doomed)
        stuck = [w for w in waited if w >= self.settings.pending_timeout_s]
        shrunk = _clamp(pool, placed + self.settings.probe_workers)
        if stuck and shrunk < n:
            return self._shrink(now, pool, len(stuck), min(stuck), shrunk)
        if not waited and placed >= n:
            self.backoff_s = None  # the whole ask found nodes: the next shortage starts a fresh back-off
        message = f"{prefix}asking for {n} spot workers for the autoscaler ({placed} placed"
        message += f", {doomed} on nodes going away)" if doomed else ")"
        below = [self.settings.pending_timeout_s - w for w in waited if w < self.settings.pending_timeout_s]
        return Decision(n, ASKING, message, recheck_s=min(below, default=None))

    def _shrink(self, now: float, pool: PoolSpec, stuck: int, waited_s: float, n: int) -> Decision:
        backoff = self.backoff_s if self.backoff_s is not None else self.settings.retry_backoff_s
        self.retry_at, self.asked_at = now + backoff, None
        self.backoff_s = min(backoff * 2, self.settings.retry_backoff_max_s)
        message = (
            f"{stuck} spot pods Pending (unschedulable) for {_duration(waited_s)}: asking for {n}, "
            f"retrying {pool.max_replicas} in {_duration(backoff)}"
        )
        return Decision(n, BACKING_OFF, message, shrunk=True, recheck_s=backoff)


def capacity_decision(nodes: Iterable[Mapping[str, Any]], pool: PoolSpec) -> Decision:
    """Capacity mode: the spot nodes present decide, clamped to [min, max]."""
    n = spot.desired_spot_replicas(nodes, pool)
    return Decision(n, CAPACITY, f"{n} spot workers: capacity on spot nodes")


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def spot_pod(pod: Mapping[str, Any], first_seen_unschedulable: float) -> SpotPod:
    """A Pod as the policy sees it: its node, or since when the scheduler found no node for it.

    The condition's lastTransitionTime is the start; `first_seen_unschedulable` stands in when it is absent."""
    node = (pod.get("spec") or {}).get("nodeName") or None
    variant = ((pod.get("metadata") or {}).get("labels") or {}).get(VARIANT_LABEL, "")
    if node:
        return SpotPod(node, variant=variant)
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            since = _epoch(cond.get("lastTransitionTime"))
            return SpotPod(None, since if since is not None else first_seen_unschedulable, variant)
    return SpotPod(None, variant=variant)


def placed_per_variant(pods: Iterable[SpotPod], doomed_nodes: set[str]) -> dict[str, int]:
    """Spot pods that have a node not going away, per variant."""
    out: dict[str, int] = {}
    for pod in pods:
        if pod.node is not None and pod.node not in doomed_nodes:
            out[pod.variant] = out.get(pod.variant, 0) + 1
    return out


def counts_as_spot_worker(pod: Mapping[str, Any]) -> bool:
    """A live spot worker pod: labelled pool=spot, not finished, not being deleted."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get("rlboost.io/pool") != "spot" or meta.get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
