"""model.source 'huggingface': huggingface_hub.snapshot_download for real, against a Hub on loopback.

No Hub can be reached from here, so `HubStandIn` answers the Hub's HTTP API where snapshot_download calls it: the
revision's info (GET /api/models/{repo}/revision/{rev} -> its commit sha), the file tree at that commit
(GET /api/models/{repo}/tree/{sha}) and each file (HEAD / GET /{repo}/resolve/{sha}/{file}), and the Hub's refusals
as the Hub sends them: status plus X-Error-Code (RepoNotFound, RevisionNotFound, GatedRepo) or X-Error-Message
(invalid credentials). The stand-in begins at that API; snapshot_download, its HTTP client, its error parsing and
the fetcher's mapping of errors to spec.model fields are the real code. The fetcher reaches it through
HF_ENDPOINT, as it would reach a Hub mirror.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlboost.models import ensure_model
from rlboost.models.errors import ModelFetchError
from rlboost.models.layout import model_dir_problem
from rlboost.models.sources import SOURCE_MARKER, fetch_model
from rlboost.nats_server import free_port
from rlboost.spec import JobSpec, ModelSpec, TaskSpec

SMALL = {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "warmupSteps": 0}
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_good"


class HubStandIn(BaseHTTPRequestHandler):
    """The Hub's API for one public repo (acme/tiny), one private (acme/private, needs TOKEN) and one gated."""

    files: dict[str, bytes] = {}
    broken = False  # answer 500 everywhere (the Hub down)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._answer()

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer()

    def log_message(self, *_: object) -> None:
        pass

    def _answer(self) -> None:
        path = self.path.split("?", 1)[0]
        repo = "/".join(path.removeprefix("/api/models/").split("/")[:2]) if path.startswith("/api/") else ""
        repo = repo or "/".join(path.lstrip("/").split("/")[:2])
        refusal = self._refusal(repo)
        if refusal:
            return self._send(*refusal)
        if path == f"/api/models/{repo}/revision/main":
            return self._send(200, json.dumps({"id": repo, "sha": COMMIT}).encode())
        if path.startswith(f"/api/models/{repo}/revision/"):
            return self._send(404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"})
        if path == f"/api/models/{repo}/tree/{COMMIT}":
            tree = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in self.files.items()
            ]
            return self._send(200, json.dumps(tree).encode())
        name = path.removeprefix(f"/{repo}/resolve/{COMMIT}/")
        if name in self.files:
            etag = f'"{hashlib.sha1(self.files[name]).hexdigest()}"'
            return self._send(
                200, self.files[name], {"X-Repo-Commit": COMMIT, "ETag": etag}, "application/octet-stream"
            )
        return self._send(404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"})

    def _refusal(self, repo: str) -> tuple[int, bytes, dict[str, str]] | None:
        auth = self.headers.get("Authorization", "")
        if self.broken:
            return 500, b'{"error": "Internal Error"}', {}
        if auth and auth != f"Bearer {TOKEN}":
            return (
                401,
                b'{"error": "Invalid credentials"}',
                {"X-Error-Message": "Invalid credentials in Authorization header"},
            )
        if repo == "acme/gated" and auth:
            return 403, b'{"error": "gated"}', {"X-Error-Code": "GatedRepo"}
        if repo not in ("acme/tiny", "acme/private", "acme/gated") or (repo != "acme/tiny" and not auth):
            return 401, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}
        return None

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, ctype: str = "application/json"):
        self.send_response(status)
        for key, value in {"Content-Type": ctype, "Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[type[HubStandIn]]:
    model = ensure_model(ModelSpec.model_validate(SMALL), TaskSpec(), tmp_path_factory.mktemp("hub") / "model")
    HubStandIn.files = {p.name: p.read_bytes() for p in model.iterdir()}
    HubStandIn.files |= {"README.md": b"# tiny", "pytorch_model.bin": b"not wanted", "onnx/model.onnx": b"no"}
    server = ThreadingHTTPServer(("127.0.0.1", 0), HubStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    HubStandIn.url = f"http://127.0.0.1:{server.server_port}"  # type: ignore[attr-defined]
    yield HubStandIn
    server.shutdown()
    thread.join(10)
    server.server_close()


@pytest.fixture
def endpoint(hub: type[HubStandIn], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)  # type: ignore[attr-defined]
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(hub, "broken", False)
    return hub.url  # type: ignore[attr-defined]


def _spec(repo: str = "acme/tiny", revision: str = "main") -> JobSpec:
    return JobSpec.model_validate({"model": {**SMALL, "source": "huggingface", "repo": repo, "revision": revision}})


def test_a_public_repo_is_downloaded_with_only_the_model_files(endpoint: str, hub, tmp_path: Path) -> None:
    dest = fetch_model(_spec(), tmp_path / "models" / "policy")
    assert model_dir_problem(dest) == ""
    names = {p.name for p in dest.iterdir()}
    assert names == {n for n in hub.files if n not in ("README.md", "pytorch_model.bin", "onnx/model.onnx")} | {
        SOURCE_MARKER
    }
    assert (dest / "model.safetensors").read_bytes() == hub.files["model.safetensors"]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["policy"]


def test_a_private_repo_needs_the_token(endpoint: str, tmp_path: Path) -> None:
    dest = fetch_model(_spec("acme/private"), tmp_path / "m", token=TOKEN)
    assert model_dir_problem(dest) == ""
    with pytest.raises(ModelFetchError) as info:
        fetch_model(_spec("acme/private"), tmp_path / "anonymous")
    assert (info.value.field, info.value.reason) == ("repo", "NotFound")
    assert "a private repository needs model.tokenSecret" in info.value.detail


@pytest.mark.parametrize(
    ("repo", "revision", "token", "field", "reason", "words"),
    [
        ("acme/tiny", "main", "hf_expired", "tokenSecret", "Unauthorized", "refused the token"),
        ("acme/nothing", "main", TOKEN, "repo", "NotFound", "may read it"),
        ("acme/tiny", "v9", None, "revision", "NotFound", "no revision 'v9'"),
        ("acme/gated", "main", TOKEN, "tokenSecret", "Unauthorized", "is gated"),
    ],
)
def test_the_hubs_refusals_name_the_field(endpoint, tmp_path, repo, revision, token, field, reason, words) -> None:
    with pytest.raises(ModelFetchError) as info:
        fetch_model(_spec(repo, revision), tmp_path / "m", token=token)
    assert (info.value.field, info.value.reason) == (field, reason), info.value
    assert words in info.value.detail
    assert not (tmp_path / "m").exists() and list(tmp_path.iterdir()) == []


def test_a_hub_that_is_down_or_unreachable_is_unreachable(endpoint: str, hub, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hub, "broken", True)
    with pytest.raises(ModelFetchError) as info:
        fetch_model(_spec(), tmp_path / "m")
    assert (info.value.field, info.value.reason) == ("repo", "Unreachable")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(ModelFetchError) as info:
        fetch_model(_spec(), tmp_path / "m")
    assert info.value.reason == "Unreachable" and info.value.exit_code == 4
