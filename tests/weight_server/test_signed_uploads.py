"""Signed uploads on the real app: the trainer's signature is stored with the manifest as sent, the payload is
chunked at the size the signature was computed with, and malformed signing headers are refused naming the field."""

from __future__ import annotations

import base64

from rlboost.wire.weights_io import HEADER_CHECKSUM, HEADER_CHUNK_BYTES, HEADER_SIGNATURE
from tests.weight_server.servers import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SIGNATURE = base64.b64encode(bytes(range(64))).decode()


def test_signature_and_chunk_size_are_kept_in_the_manifest(client) -> None:
    headers = {**AUTH, HEADER_CHECKSUM: "c0", HEADER_SIGNATURE: SIGNATURE, HEADER_CHUNK_BYTES: "8192"}
    r = client.put("/v1/versions/0", content=b"x" * 20000, headers=headers)
    assert r.status_code == 200, r.text
    m = client.get("/v1/versions/0/manifest").json()
    assert m["signature"] == SIGNATURE and m["chunk_bytes"] == 8192
    assert [c["length"] for c in m["chunks"]] == [8192, 8192, 3616]
    unsigned = client.put("/v1/versions/1", content=b"y" * 10, headers={**AUTH, HEADER_CHECKSUM: "c1"})
    assert unsigned.json()["signature"] is None and unsigned.json()["chunk_bytes"] == 4096  # the server's own


def test_malformed_signing_headers_are_refused_naming_the_field(client) -> None:
    for header, value, field in (
        (HEADER_SIGNATURE, "not-a-signature", "signature"),
        (HEADER_SIGNATURE, base64.b64encode(b"short").decode(), "signature"),
        (HEADER_CHUNK_BYTES, "100", "chunk_bytes"),
        (HEADER_CHUNK_BYTES, str(2 << 30), "chunk_bytes"),
    ):
        r = client.put("/v1/versions/0", content=b"x", headers={**AUTH, HEADER_CHECKSUM: "c", header: value})
        assert r.status_code == 422 and r.json()["field"] == field, r.text
    assert client.get("/v1/versions").json()["versions"] == []
