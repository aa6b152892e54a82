"""Every service's options, written once: a pydantic model per service that its `__main__` parses, that
renders its own argv, and a pure function per service that renders it for one deployment (a `Site`), used
by `rlboost local`'s plan and the operator's pods alike; and the model-fetch init container's options
(`ModelFetchOptions`), which the operator renders and `rlboost.models.fetch` parses. No service, and no torch,
is imported here."""

from rlboost.options.base import (
    ANY_ADDRESS,
    LOOPBACK,
    CommandOptions,
    OptionProblem,
    OptionsError,
    ServiceOptions,
    Site,
    env_default,
    parse_service_args,
)
from rlboost.options.env_runner import EnvRunnerOptions, env_runner_options
from rlboost.options.manager import ManagerOptions, manager_options
from rlboost.options.model_fetch import ModelFetchOptions
from rlboost.options.trainer import TrainerOptions, trainer_options
from rlboost.options.weight_server import WeightServerOptions, weight_server_options
from rlboost.options.worker import WorkerOptions, worker_options

SERVICES: tuple[type[ServiceOptions], ...] = (
    WeightServerOptions,
    ManagerOptions,
    WorkerOptions,
    TrainerOptions,
    EnvRunnerOptions,
)

__all__ = [
    "ANY_ADDRESS",
    "LOOPBACK",
    "SERVICES",
    "CommandOptions",
    "EnvRunnerOptions",
    "ManagerOptions",
    "ModelFetchOptions",
    "OptionProblem",
    "OptionsError",
    "ServiceOptions",
    "Site",
    "TrainerOptions",
    "WeightServerOptions",
    "WorkerOptions",
    "env_default",
    "env_runner_options",
    "manager_options",
    "parse_service_args",
    "trainer_options",
    "weight_server_options",
    "worker_options",
]
