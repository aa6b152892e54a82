"""Every kopf handler of the rlboost operator, registered by importing this module:
`kopf run -A -m rlboost_operator.handlers` (or `python -m rlboost_operator`, which imports it).

One module per concern, each keeping its collaborator in kopf's memo:

- startup.py: login, startup (fills the memo, starts the operator-wide loops) and cleanup handlers;
- lifecycle.py: the RLJob handlers: create/update/resume (validate, credentials, hold or run, children), every
  change (the job's gauges), deletion; and the end of a job on its pods (a model fetch that gave up, trainer restarts
  past backoffLimit); job_end.py scales an ended job to zero; gate.py holds a job (spec.suspend, Kueue) and
  suspension.py suspends a running one after its trainer checkpointed;
- credentials.py: the job's credentials and its workers' identity item, kept current with the cluster's keys;
- preemption.py: nodes going away become NATS notices to the jobs with pods on them;
- sizing.py: the spot Deployments sized to the spot ask, as nodes and spot pods come and go;
- status_stream.py: the job's step reports and `done` followed into its .status;
- queueing.py: each queued job's Kueue Workload;
- watches.py: the node and job-pod handlers, passing each event to the concerns above in a fixed order;
- kueue_watch.py: Kueue's Workloads of RLJobs (only with the `kueue` setting on: without Kueue installed there is no
  Workload resource to watch).
"""

from rlboost_operator import lifecycle, startup, watches
from rlboost_operator.config import load_settings

HANDLER_MODULES: tuple[object, ...] = (startup, lifecycle, watches)
if load_settings().kueue:
    from rlboost_operator import kueue_watch

    HANDLER_MODULES = (*HANDLER_MODULES, kueue_watch)
