"""Prometheus metrics of the rollout-manager (served on --metrics-port by rlboost.observability.serve_http)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

WORKERS = Gauge("rlboost_manager_workers", "Connected rollout workers", ["pool"])
WORKERS_MEMORY_RELEASED = Gauge(
    "rlboost_manager_workers_memory_released",
    "Workers whose engine memory is released for training (colocation)",
    ["pool"],
)
QUEUE_DEPTH = Gauge("rlboost_manager_requests", "Requests by state", ["state"])
ASSIGNMENTS = Counter("rlboost_manager_assignments_total", "Assignments sent to workers (first and migrated)")
TOKENS_RECEIVED = Counter("rlboost_manager_tokens_received_total", "Response tokens received and kept", ["pool"])
MIGRATIONS = Counter(
    "rlboost_manager_migrations_total", "Requests taken off a worker to continue elsewhere", ["reason"]
)
LEASE_EXPIRIES = Counter("rlboost_manager_lease_expiries_total", "Workers whose lease expired (silent too long)")
STALE_CHUNKS = Counter("rlboost_manager_stale_chunks_total", "Chunks discarded: stale lease epoch or unknown request")
REJECTED_CHUNKS = Counter(
    "rlboost_manager_rejected_chunks_total",
    "Chunks rejected: 'offset' gap, or refused output ('token_id' outside the vocabulary, bad 'logprob')",
    ["reason"],
)
FAILED_REQUESTS = Counter(
    "rlboost_manager_failed_requests_total",
    "Requests reported failed after rollout.maxRequestAttempts failed attempts, by the last attempt's reason",
    ["reason"],
)
ADOPTED = Counter(
    "rlboost_manager_adopted_requests_total",
    "Responses re-registering workers held across a manager restart: 'adopted' with their tokens, or 'refused'",
    ["result"],
)
IDENTITY_REFUSED = Counter(
    "rlboost_manager_identity_refused_total",
    "Worker streams refused because their identity proof was missing or invalid (unauthenticated) or named "
    "another worker id or pool (denied) (rlboost.auth.worker_identity), or because no Register came within "
    "--register-timeout (no_register)",
    ["reason"],
)
HELD_REFUSED = Counter(
    "rlboost_manager_held_refused_total",
    "Held responses refused before adoption because the reporting worker showed no valid assignment ticket: "
    "'ticket_missing' or 'ticket_invalid' (forged, or another worker's or request's)",
    ["reason"],
)
TOKENS_LOST = Counter("rlboost_manager_tokens_lost_total", "Tokens received but not kept (offset gaps)")
TOKENS_REGENERATED = Counter(
    "rlboost_manager_tokens_regenerated_total",
    "Tokens received again for response positions already held (a continuation that restarted too early)",
)
TOKENS_PER_S = Gauge("rlboost_manager_tokens_per_second", "Response tokens received per second", ["pool"])
TRAJECTORIES = Counter("rlboost_manager_trajectories_total", "Finished trajectories delivered to the trainer")
CARRIED = Counter(
    "rlboost_manager_carried_requests_total",
    "Unfinished requests a step's stream left at its target, continued by the next step (algorithm.partialRollout)",
)
REVOKES = Counter("rlboost_manager_revokes_total", "Requests revoked from workers", ["reason"])
PREEMPTION_NOTICES = Counter("rlboost_manager_preemption_notices_total", "Preemption notices received", ["result"])
ASSIGN_LATENCY = Histogram(
    "rlboost_manager_assignment_latency_seconds",
    "Time from a request becoming pending to its assignment",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
OFFLOAD_WINDOW = Gauge("rlboost_manager_offload_window_seconds", "Current adaptive offload window T")
REQUEST_DECODE_RATE = Histogram(
    "rlboost_manager_request_decode_tokens_per_second",
    "Per request leaving a worker: tokens it streamed there over its time there (speed-aware placement's input)",
    ["pool"],
    buckets=(1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000),
)
WEIGHT_SYNC = Histogram(
    "rlboost_manager_weight_sync_seconds",
    "From SetWeightVersion to the worker reporting it holds that version (fetch and load)",
    ["pool"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
WORKER_MESSAGES = Counter(
    "rlboost_manager_worker_messages_total",
    "Messages received on worker streams, by kind (chunks, heartbeat, weight_version, drain)",
    ["kind"],
)
CHUNK_MAX_MS = Gauge(
    "rlboost_manager_chunk_max_ms",
    "The workers' chunk flush period the manager announces (rollout.maxChunkMessagesPerS stretches it with the fleet)",
)

# ---- agentic episodes (episodes.py, runners.py) ----
ENV_RUNNERS = Gauge("rlboost_manager_env_runners", "Connected env-runners (agentic episodes)")
ENV_RUNNER_UTILISATION = Gauge(
    "rlboost_manager_env_runner_utilisation", "Episodes the env-runners drive, as a share of their capacity"
)
EPISODE_STATE = Gauge(
    "rlboost_manager_episodes_by_state",
    "Episodes by state: pending, running (on an env-runner), in_tools (running, between turns: the environment "
    "steps and the episode holds no engine slot), carried (partial rollout: on past their step's stream end, until a "
    "step lists them; also counted in pending or running)",
    ["state"],
)
EPISODES = Counter(
    "rlboost_manager_episodes_total",
    "Episodes by outcome: finished, failed (per rollout.onFailedRequest), lost (its env-runner left; started again)",
    ["outcome"],
)
EPISODE_ASSIGNMENTS = Counter("rlboost_manager_episode_assignments_total", "Episodes handed to env-runners")
TURNS = Counter("rlboost_manager_turns_total", "Model turns of episodes made generation requests")
STALE_EPISODE_MESSAGES = Counter(
    "rlboost_manager_stale_episode_messages_total",
    "Turn requests and episode results of an episode the sending env-runner no longer holds (discarded)",
)
IDLE_SLOT_SECONDS_IN_TOOLS = Counter(
    "rlboost_manager_idle_slot_seconds_in_tools_total",
    "Free worker slot-seconds while episodes were in their tools and no request was pending: engine capacity "
    "that waited for environments",
)
# issue 31: a step that cannot make progress says why (rollout_manager.starved)
STARVED_SECONDS = Gauge(
    "rlboost_manager_starved_seconds",
    "Seconds pending requests have had no worker that can take them (none registered, or none at their weight "
    "version); 0 while work can go on. Past 30 s the manager logs why, every 30 s.",
)

# what each preemption cost (issue 34; preemption_costs.py)
PREEMPTIONS = Counter(
    "rlboost_manager_preemptions_total",
    "Preempted workers, by kind: 'notice' (drained after a notice), 'silent' (stream broken) or 'expired' (went quiet, "
    "lease expired)",
    ["kind"],
)
NOTICE_TO_DRAINED_SECONDS = Histogram(
    "rlboost_manager_preemption_notice_to_drained_seconds",
    "From a drain notice to the worker's last running request handed back",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
PREEMPTED_TOKENS = Counter(
    "rlboost_manager_preempted_tokens_total",
    "Tokens preempted workers had generated of their running responses: 'in_flight' (kept + lost), 'kept' (received, "
    "the final flush included), 'lost' (generated and never sent, generated again by the next worker: 0 after a "
    "flush, else estimated from the worker's decode rate)",
    ["kind", "what"],
)
MIGRATION_RESUME_SECONDS = Histogram(
    "rlboost_manager_migration_resume_seconds",
    "From a request's hand-back by a preempted worker to its next token from another worker",
    ["reason"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
PREEMPTION_STALLED_SECONDS = Counter(
    "rlboost_manager_preemption_stalled_request_seconds_total",
    "Request-seconds from a moved request's last token kept to its next token on another worker (slot-seconds "
    "preemptions cost, a silent death's detection included)",
)
# per preemption, by kind (notice | silent | expired), as distributions (preemption_costs.py)
PREEMPTION_KINDS = ("notice", "silent", "expired")
TOKEN_BUCKETS = (0, 1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
PREEMPTION_DETECTED_SECONDS = Histogram(
    "rlboost_manager_preemption_detected_after_seconds",
    "A silent or expired death: from the worker's last message to its requests handed back (about 0 when its "
    "stream broke; the lease timeout when it went quiet)",
    ["kind"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
PREEMPTION_TOKENS_IN_FLIGHT = Histogram(
    "rlboost_manager_preemption_tokens_in_flight",
    "Per preempted worker: tokens it had generated of its running responses at the notice or death (kept + lost)",
    ["kind"],
    buckets=TOKEN_BUCKETS,
)
PREEMPTION_TOKENS_REGENERATED = Histogram(
    "rlboost_manager_preemption_tokens_regenerated",
    "Per preempted worker: tokens it generated and never sent, which the next worker generates again (0 after a "
    "notice's flush; a death's estimated from its decode rate)",
    ["kind"],
    buckets=TOKEN_BUCKETS,
)
FLEET_SLOT_SECONDS = Counter(
    "rlboost_manager_slot_seconds_total",
    "Request slot-seconds of the registered workers (capacity x time): the denominator of the share preemptions "
    "cost (rlboost_manager_preemption_stalled_request_seconds_total over it)",
)


def observe_preemption(kind: str, drained: float | None, detected: float | None, kept: int, lost: int) -> None:
    """One preempted worker's record closed: its counts and distributions."""
    PREEMPTIONS.labels(kind).inc()
    if drained is not None:
        NOTICE_TO_DRAINED_SECONDS.observe(drained)
    if detected is not None:
        PREEMPTION_DETECTED_SECONDS.labels(kind).observe(detected)
    for what, n in (("in_flight", kept + lost), ("kept", kept), ("lost", lost)):
        PREEMPTED_TOKENS.labels(kind, what).inc(n)
    PREEMPTION_TOKENS_IN_FLIGHT.labels(kind).observe(kept + lost)
    PREEMPTION_TOKENS_REGENERATED.labels(kind).observe(lost)


def zero_counters() -> None:
    """Export the migration and preemption-notice counters at 0 for every reason from the start: a dashboard panel
    of a job that saw none shows 0, not "no data" (which reads as a broken scrape)."""
    from rlboost.policies.migration import MigrationReason

    for reason in MigrationReason:
        MIGRATIONS.labels(reason.value)
    for result in ("matched", "no_match", "invalid"):
        PREEMPTION_NOTICES.labels(result)
    for kind in PREEMPTION_KINDS:  # what preemptions cost (issue 34)
        PREEMPTIONS.labels(kind)
        PREEMPTION_TOKENS_IN_FLIGHT.labels(kind)
        PREEMPTION_TOKENS_REGENERATED.labels(kind)
        for what in ("in_flight", "kept", "lost"):
            PREEMPTED_TOKENS.labels(kind, what)
    for kind in PREEMPTION_KINDS[1:]:
        PREEMPTION_DETECTED_SECONDS.labels(kind)
    for reason in (MigrationReason.DRAINED, MigrationReason.STREAM_BROKEN, MigrationReason.LEASE_EXPIRED):
        MIGRATION_RESUME_SECONDS.labels(reason.value)  # the reasons a preemption hands a request back for


zero_counters()
