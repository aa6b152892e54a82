"""What every command's options share (argv in both directions), what every service's add (the common flags),
and the deployment facts.

A service's options are one pydantic model (a bound and a description per field); its command line is
derived from the fields (`--metrics-port` is `metrics_port`, also read from RLBOOST_METRICS_PORT), so the
service's parser, `rlboost local`'s plan and the operator's pods cannot disagree:

    opts = ManagerOptions(port=50051, host="0.0.0.0")
    argv = opts.to_argv()                     # ['--port', '50051', '--host', '0.0.0.0']
    assert ManagerOptions.from_argv(argv) == opts

`parse_service_args(ManagerOptions, argv)` is the services' entry: it also loads `--config` into `opts.spec`
and turns any bad flag or spec into one line naming it, then exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from typing import Annotated, ClassVar, NamedTuple, Self, TypeVar, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic_core import PydanticUndefined

from rlboost.spec import JobSpec, JobSpecError, load_job_spec

LOOPBACK = "127.0.0.1"  # `rlboost local`: nothing listens beyond this machine
ANY_ADDRESS = "0.0.0.0"  # a pod: probes and Prometheus reach the pod's IP, not its loopback


def env_default(flag: str, default: object) -> object:
    """The value of RLBOOST_<FLAG> if set, else the default (flag 'metrics-port' -> RLBOOST_METRICS_PORT)."""
    return os.environ.get(env_name(flag), default)


def env_name(flag: str) -> str:
    return "RLBOOST_" + flag.upper().replace("-", "_")


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


HostPort = Annotated[str, AfterValidator(_host_port)]
Port = Annotated[int, Field(ge=0, le=65535)]


class OptionProblem(NamedTuple):
    """One bad option: its flag ('' when the options as a whole are inconsistent) and why."""

    flag: str
    message: str


class OptionsError(ValueError):
    """Options that a service cannot start with; `problems` names each flag at fault."""

    def __init__(self, problems: list[OptionProblem]) -> None:
        super().__init__("; ".join(f"{p.flag}: {p.message}" if p.flag else p.message for p in problems))
        self.problems = problems


def flag_of(field: str) -> str:
    return "--" + field.replace("_", "-")


class CommandOptions(BaseModel):
    """A command's options: one field per flag, rendered to argv and parsed back from it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    MODULE: ClassVar[str] = ""  # `python -m <module>` runs it
    # A flag not given defaults to RLBOOST_<FLAG> when set (a service's settings from its pod's environment).
    ENV_DEFAULTS: ClassVar[bool] = True

    @classmethod
    def prog(cls) -> str:
        """How the command names itself in usage and one-line errors."""
        return f"python -m {cls.MODULE}"

    def to_argv(self) -> list[str]:
        """The flags that render these options: every field that was set, in declaration order."""
        argv: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name not in self.model_fields_set or value is None or value is False:
                continue
            argv += [flag_of(name)] if value is True else [flag_of(name), str(value)]
        return argv

    def command(self, python: str = "python") -> list[str]:
        """The whole command line: `python -m <module> <flags>`."""
        return [python, "-m", self.MODULE, *self.to_argv()]

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        """An argparse parser with one flag per field (its default: RLBOOST_<FLAG> where read, else the field's;
        a field without a default is a required flag)."""
        parser = argparse.ArgumentParser(prog=cls.prog(), description=cls.__doc__)
        for name, info in cls.model_fields.items():
            flag = flag_of(name)
            default = env_default(flag[2:], info.default) if cls.ENV_DEFAULTS else info.default
            required = default is PydanticUndefined
            help_text = f"{info.description} ({'required' if required else f'default: {info.default!r}'}"
            help_text += f"; env {env_name(flag[2:])})" if cls.ENV_DEFAULTS else ")"
            if _is_bool(info.annotation):
                parser.add_argument(flag, action="store_true", default=default, help=help_text)
            elif required:
                parser.add_argument(flag, required=True, metavar=name.upper(), help=help_text)
            else:  # a string: pydantic converts and bounds it, so every check lives in the model
                parser.add_argument(flag, default=default, metavar=name.upper(), help=help_text)
        return parser

    @classmethod
    def from_argv(cls, argv: list[str] | None = None) -> Self:
        """Parse a command line (and RLBOOST_* variables where read); OptionsError names each bad flag."""
        values = vars(cls.parser().parse_args(argv))
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            raise OptionsError([_problem(e, cls.ENV_DEFAULTS) for e in err.errors()]) from None


class ServiceOptions(CommandOptions):
    """The flags every service takes."""

    SERVICE: ClassVar[str] = ""  # the name in `rlboost serve <service>` and in its one-line errors

    config: str = Field("", description="Job spec YAML (the defaults when empty).")
    namespace: str = Field("default", min_length=1, max_length=253, description="NATS subject namespace.")
    job: str = Field("local", min_length=1, max_length=253, description="Job name (NATS subjects, metrics labels).")
    nats_url: str = Field("nats://127.0.0.1:4222", description="NATS server URL ('' = no NATS, where allowed).")
    host: str = Field(LOOPBACK, min_length=1, description="Address the service's sockets listen on.")
    credentials_dir: str = Field(
        "", description="The job's credentials (rlboost.auth.credentials); '' = none, for a service run alone."
    )
    log_level: str = Field(
        "INFO",
        pattern="(?i)^(DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL)$",
        description="DEBUG, INFO, WARNING, ERROR or CRITICAL.",
    )

    _spec: JobSpec | None = PrivateAttr(None)

    @classmethod
    def prog(cls) -> str:
        """How the service names itself in usage and one-line errors."""
        return f"rlboost serve {cls.SERVICE}"

    @property
    def spec(self) -> JobSpec:
        """The job spec `--config` names (loaded by parse_service_args; the defaults when there is none)."""
        if self._spec is None:
            self._spec = load_job_spec(self.config) if self.config else JobSpec()
        return self._spec


T = TypeVar("T", bound=ServiceOptions)


def _problem(error: dict, env_defaults: bool) -> OptionProblem:
    """A validation error as (flag, message): a check of our own says what it got, pydantic's get the value added."""
    flag = flag_of(str(error["loc"][0])) if error["loc"] else ""
    if flag and env_defaults and env_name(flag[2:]) in os.environ:  # the bad value may have come from the environment
        flag = f"{flag} (or {env_name(flag[2:])})"
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, ValueError):
        return OptionProblem(flag, str(cause))
    return OptionProblem(flag, f"{error['msg']} (got {error['input']!r})")


def _is_bool(annotation: object) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):
        return bool in get_args(annotation)
    return annotation is bool


def parse_service_args(options: type[T], argv: list[str] | None = None) -> T:
    """A service's options with its job spec loaded; a bad flag or spec exits 2 with one line naming it."""
    try:
        opts = options.from_argv(argv)
        opts._spec = load_job_spec(opts.config) if opts.config else JobSpec()
    except (OptionsError, JobSpecError) as err:
        print(f"{options.prog()}: {err}", file=sys.stderr)
        sys.exit(2)
    return opts


class Site(BaseModel):
    """Where one job's services run: what each is told about the others, and the address its sockets bind."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: str = Field(min_length=1, description="Job spec YAML every service reads.")
    nats_url: str = Field(description="NATS server URL.")
    namespace: str = Field(min_length=1, max_length=253, description="NATS subject namespace.")
    job: str = Field(min_length=1, max_length=253, description="Job name.")
    bind_host: str = Field(min_length=1, description=f"{LOOPBACK} locally; {ANY_ADDRESS} in a pod.")
    manager_address: HostPort = Field(description="HOST:PORT the rollout-manager is dialled at.")
    weight_server_url: str = Field(min_length=1, description="Base URL the weight-server is reached at.")
    credentials_dir: str = Field("", description="Directory of the job's credentials ('' = none).")
    log_level: str = Field("INFO", description="Log level of every service.")

    def common(self) -> dict[str, str]:
        """The common flags' values, for a service's options model."""
        return {
            "config": self.config,
            "nats_url": self.nats_url,
            "namespace": self.namespace,
            "job": self.job,
            "host": self.bind_host,
            "credentials_dir": self.credentials_dir,
            "log_level": self.log_level,
        }
