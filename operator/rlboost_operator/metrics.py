"""The operator's Prometheus metrics (served on --metrics-port at /metrics).

Per-job series are labelled `rljob_namespace` and `rljob`, not `namespace` and `job`: Prometheus sets those two
on every scraped series itself (the operator pod's namespace and the scrape job), and a collision would rename
ours to `exported_*`. Job pods are scraped with the same `rljob` label (the chart's PodMonitor copies it from
the pod label `rlboost.io/job`), so one `by (rljob)` joins the operator's series with the services'.
"""

from prometheus_client import Counter, Gauge

JOB_LABELS = ["rljob_namespace", "rljob"]

RECONCILIATIONS = Counter("rlboost_operator_reconciliations_total", "RLJob reconciliations.", ["result"])
ERRORS = Counter("rlboost_operator_errors_total", "Errors by kind.", ["kind"])
SPOT_NODES = Gauge("rlboost_operator_spot_nodes", "Spot nodes currently seen, by provider.", ["provider"])
NOTICES = Counter("rlboost_operator_preemption_notices_total", "Preemption notices published to NATS.", ["reason"])
DESIRED_SPOT = Gauge("rlboost_operator_desired_spot_replicas", "Spot workers asked for per job.", JOB_LABELS)
SPOT_TARGET = Gauge(
    "rlboost_operator_spot_target",
    "Busy sizing (rollout.spot.sizing 'busy'): spot workers the step reports keep busy, per job.",
    JOB_LABELS,
)
SPOT_SHRINKS = Counter(
    "rlboost_operator_spot_pending_shrinks_total",
    "Autoscaler sizing: spot asks shrunk because spot pods stayed unschedulable past the bound.",
    JOB_LABELS,
)
SPOT_UNSCHEDULABLE = Gauge(
    "rlboost_operator_spot_unschedulable_pods", "Spot worker pods the scheduler found no node for, per job.", JOB_LABELS
)
READY_WORKERS = Gauge(
    "rlboost_operator_ready_workers",
    "Ready rollout workers per job and pool (the Deployment's status).",
    [*JOB_LABELS, "pool"],
)
LEADER = Gauge("rlboost_operator_leader", "1 while this replica holds the leader Lease and runs the controllers.")

# Per job, from its RLJob as the operator sees it (job_metrics.py): what on-call asks first.
PHASES = ("Pending", "Running", "Suspended", "Succeeded", "Failed")
JOB_PHASE = Gauge(
    "rlboost_operator_job_phase",
    "1 for the RLJob's current phase (Pending, Running, Suspended, ...), 0 for the others.",
    [*JOB_LABELS, "phase"],
)
JOB_COST = Gauge(
    "rlboost_operator_job_cost_usd", "USD spent so far by the job at spec.prices (status.costSoFar).", JOB_LABELS
)
JOB_COST_RATE = Gauge(
    "rlboost_operator_job_cost_per_hour_usd",
    "USD per hour at the job's current accelerators (status.costPerHour).",
    JOB_LABELS,
)
JOB_BUDGET = Gauge("rlboost_operator_job_budget_usd", "spec.budget in USD (jobs without one export none).", JOB_LABELS)
JOB_STEPS = Gauge(
    "rlboost_operator_job_steps_completed", "Optimizer steps the job completed (status.stepsCompleted).", JOB_LABELS
)
JOB_STEPS_TOTAL = Gauge(
    "rlboost_operator_job_steps_total", "Optimizer steps the job runs (spec.algorithm.steps).", JOB_LABELS
)
TRAINER_RESTARTS = Gauge(
    "rlboost_operator_trainer_restarts",
    "Restarts after failures of the job's trainer rank that failed most (status.trainerRestarts).",
    JOB_LABELS,
)
TRAINER_BACKOFF_LIMIT = Gauge(
    "rlboost_operator_trainer_backoff_limit",
    "spec.trainer.backoffLimit: more restarts than this fail the job.",
    JOB_LABELS,
)
JOB_SUSPENDING = Gauge(
    "rlboost_operator_job_suspending",
    "1 while the operator asks the job's trainer to checkpoint before suspending it (spec.suspend, a Kueue eviction).",
    JOB_LABELS,
)
