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
