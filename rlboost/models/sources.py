"""The model of a job spec made ready in a directory, by `spec.model.source` (the library behind the init
container's command, rlboost.models.fetch, and behind `ensure_model` for downloaded models):
  tiny         create it (rlboost.models.tiny_cache; from the cache when it holds it)
  huggingface  huggingface_hub.snapshot_download of `repo` at `revision`, only the files a model directory needs
               (MODEL_PATTERNS: safetensors, config, tokenizer, generation config, chat template); the token from
               --token-file, else $HF_TOKEN (on Kubernetes: the Secret `tokenSecret`, key `token`); $HF_ENDPOINT
               names a Hub mirror
  uri          fsspec (s3fs for s3://, gcsfs for gs://) copies the same files from under the prefix; credentials
               come from the environment as the SDKs find them (IRSA on EKS, Workload Identity on GKE)
  path         nothing is copied: `model.path` is checked
  pvc          nothing is copied: the claim is mounted already, and the model directory inside it is checked

A download lands in a temporary sibling of the destination, is checked (config.json with a model_type, a
tokenizer, readable safetensors: rlboost.models.layout) and renamed into place, so no reader sees half a model; a
directory already holding the model of the same source (init container restarted) is reused. A failure is a
ModelFetchError naming the spec.model field at fault (rlboost.models.errors).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from rlboost.models.atomic import fill_atomically
from rlboost.models.errors import (
    INVALID_MODEL,
    NOT_FOUND,
    UNAUTHORIZED,
    UNREACHABLE,
    UNSUPPORTED,
    ModelError,
    ModelFetchError,
)
from rlboost.models.layout import MODEL_PATTERNS, model_dir_problem, wanted
from rlboost.models.tiny_cache import ensure_tiny_model
from rlboost.spec import JobSpec, ModelSpec

log = logging.getLogger(__name__)

SOURCE_MARKER = ".rlboost-source.json"  # in a fetched directory: what it was fetched from
# Exception class names (anywhere in the MRO) of SDKs we do not import, by what they mean.
_UNREACHABLE_NAMES = {
    "ConnectError",
    "ConnectTimeout",
    "ConnectionError",
    "TimeoutException",
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ClientConnectorError",
    "ServerTimeoutError",
    "TransportError",
    "TimeoutError",
    "ConnectionRefusedError",
    "gaierror",
}
_UNAUTHORIZED_NAMES = {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError", "RefreshError"}


def fetch_model(spec: JobSpec, dest: str | Path, token: str | None = None) -> Path:
    """Make the model of `spec.model` ready and return its directory (`dest`, or `model.path` for 'path')."""
    model, dest = spec.model, Path(dest)
    if model.source == "path":
        return checked(Path(model.path), "path")
    if model.source == "pvc":
        return checked(dest, "path" if model.path else "claimName", f"claim {model.claim_name!r}")
    if model.source == "tiny":
        return _tiny(spec, dest)
    if _reusable(dest, model):
        log.info("model already fetched", extra={"dest": str(dest), "source": model.source})
        return dest
    if model.source == "huggingface":
        fill: Callable[[Path], None] = lambda tmp: download_huggingface(model, tmp, token)  # noqa: E731
    else:
        fill = lambda tmp: download_uri(model.uri, tmp)  # noqa: E731
    field = "repo" if model.source == "huggingface" else "uri"
    _fetch_atomically(dest, model, field, fill)
    return dest


def checked(path: Path, field: str, where: str = "") -> Path:
    """`path` if it holds a usable model; else ModelFetchError naming `field` (NotFound or InvalidModel)."""
    problem = model_dir_problem(path)
    if not problem:
        return path
    reason = NOT_FOUND if not path.is_dir() else INVALID_MODEL
    suffix = f" (in {where})" if where else ""
    raise ModelFetchError(field, reason, f"{problem}{suffix}; point it at a Hugging Face model directory")


def _tiny(spec: JobSpec, dest: Path) -> Path:
    try:
        return ensure_tiny_model(spec.model, spec.task, dest)
    except ModelError as err:
        raise ModelFetchError("path", INVALID_MODEL, str(err)) from None


def source_identity(model: ModelSpec) -> dict[str, str]:
    """What a fetched directory was fetched from: a directory of another source or revision is not reused."""
    if model.source == "huggingface":
        return {"source": "huggingface", "repo": model.repo, "revision": model.revision}
    return {"source": model.source, "uri": model.uri.rstrip("/")}


def _reusable(dest: Path, model: ModelSpec) -> bool:
    try:
        marker = json.loads((dest / SOURCE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker == source_identity(model) and not model_dir_problem(dest)


def _fetch_atomically(dest: Path, model: ModelSpec, field: str, fill: Callable[[Path], None]) -> None:
    """Download into a temporary sibling, check it, mark it, then rename it into place."""

    def fill_and_check(tmp: Path) -> None:
        fill(tmp)
        problem = model_dir_problem(tmp)
        if problem:
            raise ModelFetchError(field, INVALID_MODEL, f"the files fetched are not a model: {problem}")
        (tmp / SOURCE_MARKER).write_text(json.dumps(source_identity(model)))

    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        shutil.rmtree(dest) if dest.is_dir() else dest.unlink()  # a stale or partial copy: replaced whole
    fill_atomically(dest, fill_and_check)
    log.info("model fetched", extra={"dest": str(dest), **source_identity(model)})


# ---- Hugging Face Hub ----------------------------------------------------------------------------------------


def hf_token(token_file: str | None) -> str | None:
    """The Hub token: the file's contents, else $HF_TOKEN, else None (anonymous)."""
    if token_file:
        try:
            return Path(token_file).read_text().strip() or None
        except OSError as err:
            raise ModelFetchError(
                "tokenSecret", NOT_FOUND, f"cannot read the token file {token_file}: {err.strerror}"
            ) from None
    return os.environ.get("HF_TOKEN") or None


def download_huggingface(model: ModelSpec, dest: Path, token: str | None) -> None:
    """snapshot_download of the model's files into `dest`; Hub errors become ModelFetchErrors naming the field."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # a progress bar would break JSON log lines
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(
            model.repo,
            revision=model.revision,
            token=token or False,  # False: never a token found on the machine, only the one given
            local_dir=dest,
            cache_dir=dest / ".cache" / "hub",  # its bookkeeping stays in the download, not in $HOME
            allow_patterns=list(MODEL_PATTERNS),
            endpoint=os.environ.get("HF_ENDPOINT") or None,  # a Hub mirror, read now (not at import)
        )
    except Exception as err:  # noqa: BLE001 (mapped to one line naming the field; unknown ones re-raised)
        raise hf_error(err, model, token is not None) from None
    shutil.rmtree(dest / ".cache", ignore_errors=True)  # snapshot_download's download metadata


def hf_error(err: Exception, model: ModelSpec, with_token: bool) -> Exception:
    """A huggingface_hub error as a ModelFetchError naming the spec.model field at fault (else `err` itself)."""
    from huggingface_hub import errors

    status = getattr(getattr(err, "response", None), "status_code", None)
    repo, rev = model.repo, model.revision
    if isinstance(err, errors.GatedRepoError):
        return ModelFetchError(
            "tokenSecret",
            UNAUTHORIZED,
            f"{repo} is gated: accept its terms on the Hub with the account whose token model.tokenSecret holds",
        )
    if isinstance(err, errors.RepositoryNotFoundError):
        if with_token:
            hint = "check the id, and that the token in model.tokenSecret may read it"
        else:
            hint = "check the id; a private repository needs model.tokenSecret"
        return ModelFetchError("repo", NOT_FOUND, f"repository {repo!r} not found on the Hub, or not readable: {hint}")
    if isinstance(err, errors.RevisionNotFoundError):
        return ModelFetchError("revision", NOT_FOUND, f"{repo} has no revision {rev!r} (a branch, tag or commit)")
    if isinstance(err, errors.HfHubHTTPError) and status in (401, 403):
        return ModelFetchError(
            "tokenSecret", UNAUTHORIZED, f"the Hub refused the token for {repo} (HTTP {status}): renew the Secret"
        )
    if isinstance(err, errors.HFValidationError):
        return ModelFetchError("repo", NOT_FOUND, f"{repo!r} is not a valid repository id: {err}")
    unreachable = isinstance(err, errors.LocalEntryNotFoundError) or _named(err, _UNREACHABLE_NAMES)
    if unreachable or (isinstance(err, errors.HfHubHTTPError) and (status or 0) >= 500):
        return ModelFetchError("repo", UNREACHABLE, f"cannot reach the Hub for {repo}: {_first_line(err)}")
    if isinstance(err, errors.HfHubHTTPError):
        return ModelFetchError("repo", NOT_FOUND, f"the Hub refused {repo}@{rev}: {_first_line(err)}")
    return err


# ---- object storage ------------------------------------------------------------------------------------------


def download_uri(uri: str, dest: Path) -> None:
    """Copy the model's files directly under `uri` (s3:// or gs://) into `dest` with fsspec."""
    fs, root = filesystem(uri)
    try:
        entries = fs.ls(root, detail=True)
        files = [e for e in entries if e.get("type") == "file" and wanted(e["name"].rsplit("/", 1)[-1])]
        if not files:
            raise ModelFetchError(
                "uri",
                NOT_FOUND,
                f"{uri} holds no model files (config.json, *.safetensors, tokenizer) directly under it",
            )
        for entry in files:
            fs.get_file(entry["name"], str(dest / entry["name"].rsplit("/", 1)[-1]))
    except ModelFetchError:
        raise
    except Exception as err:  # noqa: BLE001 (mapped to one line naming the field; unknown ones re-raised)
        raise uri_error(err, uri) from None


def filesystem(uri: str):
    """The fsspec filesystem of `uri` and the path inside it; ModelFetchError (Unsupported) when its scheme's
    package is not installed. The export of a trained policy writes through it too (rlboost.export)."""
    import fsspec

    scheme = uri.split("://", 1)[0]
    try:
        return fsspec.core.url_to_fs(uri, skip_instance_cache=True)  # the environment's credentials of now
    except ImportError as err:
        extra = {"s3": "s3fs", "gs": "gcsfs"}.get(scheme, scheme)
        raise ModelFetchError(
            "uri",
            UNSUPPORTED,
            f"this image cannot read {scheme}:// ({extra} is not installed: pip install 'rlboost[models]'): {err}",
        ) from None


def uri_error(err: Exception, uri: str) -> Exception:
    """An object-store error as a ModelFetchError naming spec.model.uri (else `err` itself)."""
    if isinstance(err, FileNotFoundError):
        return ModelFetchError("uri", NOT_FOUND, f"{uri} does not exist (no such bucket or prefix)")
    if isinstance(err, PermissionError) or _named(err, _UNAUTHORIZED_NAMES):
        return ModelFetchError(
            "uri",
            UNAUTHORIZED,
            f"access to {uri} refused: {_first_line(err)}; give the pod's service account read "
            "access (IRSA role on EKS, Workload Identity on GKE)",
        )
    if _named(err, _UNREACHABLE_NAMES) or isinstance(err, ConnectionError | TimeoutError):
        return ModelFetchError("uri", UNREACHABLE, f"cannot reach the object store for {uri}: {_first_line(err)}")
    if isinstance(err, OSError):
        return ModelFetchError("uri", UNREACHABLE, f"reading {uri} failed: {_first_line(err)}")
    return err


# ---- helpers -------------------------------------------------------------------------------------------------


def _named(err: BaseException, names: set[str]) -> bool:
    """Whether the error, or one it was raised from, is of a class named in `names` (SDKs we do not import)."""
    seen: BaseException | None = err
    while seen is not None:
        if any(cls.__name__ in names for cls in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:300]
