"""The operator's Prometheus metrics (served on --metrics-port at /metrics)."""

from prometheus_client import Counter, Gauge

RECONCILIATIONS = Counter("rlboost_operator_reconciliations_total", "RLJob reconciliations.", ["result"])
ERRORS = Counter("rlboost_operator_errors_total", "Errors by kind.", ["kind"])
SPOT_NODES = Gauge("rlboost_operator_spot_nodes", "Spot nodes currently seen, by provider.", ["provider"])
NOTICES = Counter("rlboost_operator_preemption_notices_total", "Preemption notices published to NATS.", ["reason"])
DESIRED_SPOT = Gauge("rlboost_operator_desired_spot_replicas", "Spot workers asked for per job.", ["namespace", "job"])
LEADER = Gauge("rlboost_operator_leader", "1 while this replica holds the leader Lease and runs the controllers.")
