"""The model-fetch init container of trainer and reserved pods: the policy model a job spec names, made ready in
a local directory (rlboost.models.sources says how, per `spec.model.source`).

    python -m rlboost.models.fetch --config /etc/rlboost/job.yaml --dest /models/policy \\
        [--token-file FILE] [--termination-log /dev/termination-log]

Its flags are rlboost.options.ModelFetchOptions (the operator renders the init container's from the same model).
A failure prints one line naming the field and why, `spec.model.<field>: <Reason>: <detail>`, writes the same line
to --termination-log (Kubernetes shows it in the pod's status; the operator copies it into the RLJob's
condition), and exits with a code that says whose problem it is:
  2  usage: bad flags, or a job spec that does not load
  3  the model source cannot be used: not found, credentials refused, not a model (retrying will not help)
  4  the source is unreachable: network, DNS, a server error (may be transient)
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from rlboost.models.errors import EXIT_USAGE, ModelFetchError
from rlboost.models.sources import fetch_model, hf_token
from rlboost.options.base import OptionsError
from rlboost.options.model_fetch import PROG, ModelFetchOptions
from rlboost.spec import JobSpecError, load_job_spec


def _report(line: str, termination_log: str) -> None:
    print(f"{PROG}: {line}", file=sys.stderr)
    if termination_log:
        try:
            Path(termination_log).write_text(line + "\n")
        except OSError as err:  # the message still went to stderr (FallbackToLogsOnError)
            print(f"{PROG}: cannot write {termination_log}: {err.strerror}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    try:
        args = ModelFetchOptions.from_argv(argv)
    except OptionsError as err:  # the flags, --termination-log among them, did not validate: stderr says it
        _report(str(err), "")
        return EXIT_USAGE
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        spec = load_job_spec(args.config)
    except JobSpecError as err:
        _report(str(err).replace("\n", " "), args.termination_log)
        return EXIT_USAGE
    try:
        path = fetch_model(spec, args.dest, hf_token(args.token_file))
    except ModelFetchError as err:
        _report(str(err), args.termination_log)
        return err.exit_code
    print(f"{PROG}: model ready in {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
