"""Static checks of the container images' recipes: pyproject's extras, requirements/lock.txt, docker/*.Dockerfile,
scripts/build_images.sh and the release workflow agree with each other and with the services' code.

No image is built here (`make images` builds the CPU ones and runs each one's import smoke test); the GPU
images, whose bases cannot be pulled on the test machines, are held to the same extras and lock by these checks.
Distribution metadata (which module a distribution provides, what it requires) is read from this environment,
where `make test` installed every extra from the same lock.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rlboost.cpu_numerics import CPU_NUMERICS_ENV
from rlboost_operator.children import IMAGES
from rlboost_operator.config import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
LOCK = ROOT / "requirements" / "lock.txt"
CHART = ROOT / "deploy" / "helm" / "rlboost"

# Dockerfile -> (its service's package, the extras it installs, third-party modules it leaves out on purpose)
DOCKERFILES = {
    "rollout-manager.Dockerfile": ("rollout_manager", ["manager"], []),
    "weight-server.Dockerfile": ("weight_server", ["weight-server"], []),
    "operator.Dockerfile": ("rlboost_operator", ["operator"], []),
    "rollout-worker.Dockerfile": ("rollout_worker", ["worker"], ["sglang"]),
    "trainer.Dockerfile": ("trainer", ["trainer"], []),
    "rollout-worker-sglang.Dockerfile": ("rollout_worker", ["worker", "sglang"], []),
    "trainer-cuda.Dockerfile": ("trainer", ["trainer"], []),
    "env-runner.Dockerfile": (
        "env_runner",
        ["env-runner"],
        ["torch", "datasets", "pyarrow", "fsspec", "huggingface_hub"],  # the model factory's, never called there
    ),
}
GPU_DOCKERFILES = {"rollout-worker-sglang.Dockerfile", "trainer-cuda.Dockerfile"}
CPU_TORCH_DOCKERFILES = ["rollout-worker.Dockerfile", "trainer.Dockerfile"]
HEAVY = {"torch", "deepspeed", "transformers", "sglang"}


def _service_imports_module():
    spec = importlib.util.spec_from_file_location("service_imports", ROOT / "scripts" / "service_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


service_imports = _service_imports_module()


@cache
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def extra_requirements(extras: list[str]) -> list[Requirement]:
    """The core dependencies plus those of `extras`, with rlboost's own extras (rlboost[worker]) expanded."""
    project = pyproject()["project"]
    out = [Requirement(r) for r in project["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in map(Requirement, project["optional-dependencies"][extra]):
            if canonicalize_name(req.name) == "rlboost":
                todo.extend(req.extras)
            else:
                out.append(req)
    return out


def closure(extras: list[str]) -> set[str]:
    return _closure(tuple(extras))


@cache
def _closure(extras: tuple[str, ...]) -> set[str]:
    """Every distribution (canonical name) installing `extras` brings, following installed metadata."""
    followed: dict[str, set[str]] = {}  # distribution -> its extras whose requirements were followed
    todo = extra_requirements(list(extras))
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        new = {"", *req.extras} - followed.setdefault(name, set())
        if not new:
            continue
        followed[name] |= new
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (sglang): its own requirements are its image's business
        for sub in map(Requirement, requires):
            if sub.marker is None or any(sub.marker.evaluate({"extra": extra}) for extra in new):
                todo.append(sub)
    return set(followed)


@cache
def module_distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions_of(module: str) -> set[str]:
    """Distributions providing a top-level module (its own name where none is installed here)."""
    names = module_distributions().get(module) or [module]
    return {canonicalize_name(n) for n in names}


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        pin = line.split("#", 1)[0].strip()
        if pin:
            name, version = pin.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def run_lines(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (DOCKER / dockerfile).read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("dockerfile", sorted(DOCKERFILES))
def test_each_extra_covers_what_its_service_imports(dockerfile: str) -> None:
    service, extras, without = DOCKERFILES[dockerfile]
    provided = closure(extras)
    missing = {
        module: sorted(users)
        for module, users in service_imports.third_party_imports(service).items()
        if module not in without and not distributions_of(module) & provided
    }
    assert not missing, f"{dockerfile}: extras {extras} lack what {service} imports: {missing}"


@pytest.mark.parametrize("extra", ["manager", "weight-server", "operator"])
def test_services_without_torch_install_none_of_it(extra: str) -> None:
    assert not closure([extra]) & HEAVY, f"rlboost[{extra}] brings {sorted(closure([extra]) & HEAVY)}"


def test_the_env_runner_tokenises_without_torch() -> None:
    """Env-runners run on cheap CPU (spot) nodes: the tokenizer and chat template, never an engine."""
    assert not closure(["env-runner"]) & (HEAVY - {"transformers"})


@pytest.mark.parametrize("extra", ["manager", "weight-server", "worker", "trainer"])
def test_only_the_operator_installs_kopf(extra: str) -> None:
    assert "kopf" not in closure([extra])


def test_the_lock_pins_every_requirement_of_every_extra() -> None:
    pins = lock_pins()
    extras = [e for e in pyproject()["project"]["optional-dependencies"] if e != "sglang"]
    needed = {canonicalize_name(r.name) for r in extra_requirements(extras)}
    assert needed - pins.keys() == set(), f"requirements/lock.txt lacks {sorted(needed - pins.keys())}: run make lock"
    assert pins["torch"] == "2.13.0", "torch is pinned without a local tag, so the CPU and CUDA builds both satisfy it"


@pytest.mark.parametrize("dockerfile", sorted(DOCKERFILES))
def test_every_dockerfile_installs_its_extras_from_the_lock(dockerfile: str) -> None:
    service, extras, without = DOCKERFILES[dockerfile]
    lines = run_lines(dockerfile)
    installs = [line for line in lines if re.search(r"\bpip install\b", line)]
    assert any("COPY requirements/lock.txt" in line for line in lines)
    extra_spec = f"'.[{','.join(extras)}]'"
    if dockerfile in GPU_DOCKERFILES:  # the base image's torch/engine stay; the lock fills in the rest
        assert any("lock_over_base.py requirements/lock.txt > /tmp/constraints.txt" in line for line in lines)
        assert any(f"pip install -c /tmp/constraints.txt {extra_spec}" in line for line in installs), installs
    else:
        assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in lines
        assert any(f"pip install -c requirements/lock.txt {extra_spec}" in line for line in installs), installs
    for line in installs:  # versions come from the lock and pyproject only, never from a hand-made list
        assert not re.search(r"[\w\]\"'](==|>=|<=|~=)", line.split("-c ", 1)[-1].split(" ", 1)[-1]), line


# What the dependency layers may be built from: a file copied before the extras' install that is not one of these
# (README.md, say) makes every edit of it reinstall the service's dependencies.
DEPENDENCY_INPUTS = {"pyproject.toml", "requirements/lock.txt", "scripts/lock_over_base.py"}


@pytest.mark.parametrize("dockerfile", sorted(DOCKERFILES))
def test_dependency_layers_depend_only_on_pyproject_and_the_lock(dockerfile: str) -> None:
    lines = run_lines(dockerfile)
    _, extras, _ = DOCKERFILES[dockerfile]
    extra_spec = f"'.[{','.join(extras)}]'"
    install = next(i for i, line in enumerate(lines) if re.search(r"\bpip install\b", line) and extra_spec in line)
    copied = {src for line in lines[:install] if line.startswith("COPY ") for src in line.split()[1:-1]}
    assert copied <= DEPENDENCY_INPUTS, (
        f"{dockerfile}: the dependency layer also depends on {copied - DEPENDENCY_INPUTS}"
    )


@pytest.mark.parametrize("dockerfile", sorted(DOCKERFILES))
def test_every_image_smoke_tests_its_service_as_its_own_user(dockerfile: str) -> None:
    service, _, without = DOCKERFILES[dockerfile]
    lines = run_lines(dockerfile)
    check = f"scripts/service_imports.py --check {service}" + "".join(f" --without {m}" for m in without)
    smoke = [i for i, line in enumerate(lines) if line.startswith("RUN ") and line.endswith(check)]
    user = [i for i, line in enumerate(lines) if line.startswith("USER ")]
    assert smoke and user and user[-1] < smoke[-1], f"{dockerfile}: no `RUN python {check}` after USER"
    assert lines[user[-1]] == "USER 10001:10001"
    assert re.fullmatch(rf'ENTRYPOINT \["python3?", "-m", "{service}"\]', lines[-1]), lines[-1]


@pytest.mark.parametrize("dockerfile", sorted(DOCKERFILES))
def test_images_with_the_codec_give_numba_a_writable_cache(dockerfile: str) -> None:
    _, extras, _ = DOCKERFILES[dockerfile]
    if "numba" in closure(extras):
        assert "NUMBA_CACHE_DIR=/tmp/numba-cache" in (DOCKER / dockerfile).read_text()


@pytest.mark.parametrize("dockerfile", CPU_TORCH_DOCKERFILES)
def test_cpu_torch_images_pin_the_cpu_numerics(dockerfile: str) -> None:
    """The CPU images' processes compute as `rlboost local`'s do (rlboost.cpu_numerics), on any x86 node."""
    text = (DOCKER / dockerfile).read_text()
    env = dict(re.findall(r"\b([A-Z_]+)=(\S+)", " ".join(re.findall(r"^ENV (.*)$", text, re.M))))
    assert {k: env.get(k) for k in CPU_NUMERICS_ENV} == CPU_NUMERICS_ENV


def test_cpu_torch_images_share_their_torch_layer() -> None:
    heads = []
    for dockerfile in CPU_TORCH_DOCKERFILES:
        lines = run_lines(dockerfile)
        end = next(i for i, line in enumerate(lines) if line.startswith("RUN pip install") and line.endswith(" torch"))
        heads.append(lines[: end + 1])
    assert heads[0] == heads[1]


def build_script_images() -> list[str]:
    match = re.search(r'^ALL_IMAGES="([^"]+)"', (ROOT / "scripts" / "build_images.sh").read_text(), re.M)
    return match.group(1).split()


def test_built_and_released_images_are_the_ones_the_chart_and_operator_run() -> None:
    wanted = {"operator", *IMAGES.values()}
    built = build_script_images()
    assert set(built) | {"rollout-worker-sglang"} == wanted
    assert {f"{name}.Dockerfile" for name in built} <= set(DOCKERFILES)
    release = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    matrix = release["jobs"]["images"]["strategy"]["matrix"]["include"]
    assert {entry["name"] for entry in matrix} == wanted
    assert {entry["dockerfile"] for entry in matrix} <= {f"docker/{name}" for name in DOCKERFILES}


def test_image_tags_follow_the_charts_app_version() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())["images"]
    assert values["tag"] == app_version
    assert OperatorSettings.model_fields["image_tag"].default == app_version
    assert values["registry"] == OperatorSettings.model_fields["image_registry"].default == "ghcr.io/rlboost"


def test_the_smoke_test_names_a_missing_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A service importing a module the environment lacks fails the check, naming the module and its importer."""
    package = tmp_path / "smoke_test_service"
    package.mkdir()
    (package / "__init__.py").write_text("import yaml\n")
    (package / "server.py").write_text("def serve():\n    import no_such_module_xyz\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert service_imports.check("smoke_test_service", set()) == 1
    finally:
        sys.path.remove(str(tmp_path))
    assert "MISSING no_such_module_xyz: imported by smoke_test_service.server" in capsys.readouterr().err
