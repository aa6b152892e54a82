"""The model's assets on the weight-server over real HTTP (uvicorn on loopback in a thread): upload auth, list,
get, immutability, bounds, persistence across a restart, and the client's pull into a model directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from rlboost.weights.client import WeightClient, WeightServerError
from rlboost.wire.weights_io import MAX_ASSET_BYTES, MAX_ASSETS, MAX_ASSETS_TOTAL_BYTES, AssetInfo, AssetList
from tests.weight_server.servers import TOKEN, ThreadServer
from weight_server.assets import admit
from weight_server.errors import ErrorKind, StoreError

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIG = json.dumps({"model_type": "qwen3", "hidden_size": 32}).encode()


def test_upload_list_and_get(client) -> None:
    resp = client.put("/v1/assets/config.json", content=CONFIG, headers=AUTH)
    assert resp.status_code == 200, resp.text
    info = AssetInfo.model_validate(resp.json())
    assert (info.name, info.size, info.sha256) == ("config.json", len(CONFIG), hashlib.sha256(CONFIG).hexdigest())
    client.put("/v1/assets/tokenizer.json", content=b"{}", headers=AUTH).raise_for_status()
    listed = AssetList.model_validate(client.get("/v1/assets").json())
    assert [a.name for a in listed.assets] == ["config.json", "tokenizer.json"] and listed.assets[0] == info
    got = client.get("/v1/assets/config.json")
    assert got.content == CONFIG and got.headers["etag"] == f'"{info.sha256}"'
    missing = client.get("/v1/assets/vocab.json")
    assert missing.status_code == 404 and missing.json()["field"] == "name"


def test_uploads_need_the_job_token(client) -> None:
    assert client.put("/v1/assets/config.json", content=CONFIG).status_code == 401
    wrong = client.put("/v1/assets/config.json", content=CONFIG, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["field"] == "Authorization"
    assert client.get("/v1/assets").json()["assets"] == []


def test_assets_are_immutable_but_the_same_bytes_may_come_again(client) -> None:
    assert client.put("/v1/assets/config.json", content=CONFIG, headers=AUTH).status_code == 200
    assert client.put("/v1/assets/config.json", content=CONFIG, headers=AUTH).status_code == 200  # a restart
    other = client.put("/v1/assets/config.json", content=b'{"model_type": "llama"}', headers=AUTH)
    assert other.status_code == 409 and "immutable" in other.json()["error"]
    assert client.get("/v1/assets/config.json").content == CONFIG


@pytest.mark.parametrize("name", [".hidden", "a b", "x" * 129, ".incoming-1"])
def test_names_that_are_not_plain_file_names_are_refused(client, name: str) -> None:
    resp = client.put(f"/v1/assets/{name}", content=b"x", headers=AUTH)
    assert resp.status_code == 422 and resp.json()["field"] == "name"


def test_sizes_are_bounded_declared_or_streamed(client) -> None:
    too_big = b"x" * (MAX_ASSET_BYTES + 1)
    declared = client.put("/v1/assets/tokenizer.json", content=too_big, headers=AUTH)
    assert declared.status_code == 413 and declared.json()["field"] == "Content-Length"

    def chunked():  # no Content-Length: the server counts as the bytes arrive
        for _ in range(MAX_ASSET_BYTES // (1 << 20) + 1):
            yield b"x" * (1 << 20)

    streamed = client.put("/v1/assets/tokenizer.json", content=chunked(), headers=AUTH)
    assert streamed.status_code == 413
    assert client.get("/v1/assets").json()["assets"] == []


def test_the_count_of_assets_is_bounded(client) -> None:
    for i in range(MAX_ASSETS):
        client.put(f"/v1/assets/a{i}.json", content=b"{}", headers=AUTH).raise_for_status()
    resp = client.put("/v1/assets/one-more.json", content=b"{}", headers=AUTH)
    assert resp.status_code == 413 and f"at most {MAX_ASSETS}" in resp.json()["error"]


def test_the_total_of_assets_is_bounded() -> None:
    each = MAX_ASSET_BYTES
    held = {f"a{i}": AssetInfo(name=f"a{i}", size=each, sha256="0" * 64) for i in range(MAX_ASSETS_TOTAL_BYTES // each)}
    with pytest.raises(StoreError) as info:
        admit(held, "b", 1)
    assert info.value.kind is ErrorKind.TOO_LARGE and "total" in info.value.message
    admit(held, "a0", each)  # replacing one by itself adds nothing


def test_assets_survive_a_restart_and_interrupted_puts_are_cleared(tmp_path: Path) -> None:
    with ThreadServer(tmp_path / "data") as srv, httpx.Client(base_url=srv.url) as c:
        c.put("/v1/assets/config.json", content=CONFIG, headers=AUTH).raise_for_status()
    (tmp_path / "data" / "assets" / ".incoming-dead").write_bytes(b"half")
    with ThreadServer(tmp_path / "data") as srv, httpx.Client(base_url=srv.url) as c:
        assert [a["name"] for a in c.get("/v1/assets").json()["assets"]] == ["config.json"]
    assert not (tmp_path / "data" / "assets" / ".incoming-dead").exists()


async def test_client_uploads_and_pulls_assets_into_a_model_directory(server, tmp_path: Path) -> None:
    async with WeightClient(server.url, token=TOKEN) as wc, WeightClient(server.url) as reader:
        await wc.upload_asset("config.json", CONFIG)
        await wc.upload_asset("chat_template.jinja", b"{{ messages }}")
        written = await reader.pull_assets(tmp_path / "model")
        assert sorted(p.name for p in written) == ["chat_template.jinja", "config.json"]
        assert (tmp_path / "model" / "config.json").read_bytes() == CONFIG
        assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["chat_template.jinja", "config.json"]
        with pytest.raises(WeightServerError) as info:
            await reader.upload_asset("config.json", CONFIG)  # no token
        assert info.value.status == 401
