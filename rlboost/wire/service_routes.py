"""The two HTTP routes every rlboost process answers outside any API, unauthenticated: kubelet probes and Prometheus.

Served by rlboost.observability (manager, worker, trainer), by the weight-server's app and by the operator; the
operator's pod builders point probes at HEALTHZ. Each spelled once, here.
"""

from __future__ import annotations

HEALTHZ = "/healthz"  # 200 while the process is healthy, else 503
METRICS = "/metrics"  # Prometheus text format
