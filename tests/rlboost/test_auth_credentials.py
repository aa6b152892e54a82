"""Job credentials: made once, private, each role's items complete, TLS chains to the job CA."""

import stat
from pathlib import Path

import pytest
from cryptography import x509

from rlboost.auth.credentials import (
    ROLE_ITEMS,
    TICKET_KEY,
    WORKER_IDENTITY_CLUSTER,
    CredentialsError,
    JobCredentials,
    add_missing,
    added_items,
    generate,
    generate_items,
)


def test_generated_directory_is_private_and_tokens_differ(tmp_path: Path) -> None:
    creds = generate(tmp_path / "c")
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o700
    for f in (tmp_path / "c").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    tokens = creds.tokens()
    assert set(tokens) == {"trainer", "worker", "observer", "env-runner"}
    assert len(set(tokens.values())) == 4
    assert generate(tmp_path / "d").token("worker") != tokens["worker"]


def test_signature_by_trainer_key_verifies_with_worker_key(tmp_path: Path) -> None:
    creds = generate(tmp_path)
    signature = creds.signing_key().sign(b"manifest")
    creds.verify_key().verify(signature, b"manifest")
    with pytest.raises(Exception):  # noqa: B017 - cryptography's InvalidSignature
        creds.verify_key().verify(signature, b"manifest, altered")


def test_every_role_item_exists_when_tls_is_made() -> None:
    hosts = {s: [f"{s}.ns.svc", "127.0.0.1"] for s in ("manager", "weight-server", "nats")}
    items = generate_items(hosts)
    for role, names in ROLE_ITEMS.items():
        assert set(names) - {WORKER_IDENTITY_CLUSTER} <= set(items), role  # the operator writes that one
    ca = x509.load_pem_x509_certificate(items["ca.crt"])
    cert = x509.load_pem_x509_certificate(items["tls-manager.crt"])
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "manager.ns.svc" in names.get_values_for_type(x509.DNSName)


def test_missing_item_names_file_and_fix(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="token-worker.*rlboost.auth.credentials"):
        JobCredentials(tmp_path).token("worker")
    assert JobCredentials(tmp_path).tls("manager") is None


def test_older_credentials_get_only_the_items_added_since(tmp_path: Path) -> None:
    creds = generate(tmp_path)
    (tmp_path / TICKET_KEY).unlink()  # made before the manager's ticket key existed
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(added_items(before)) == {TICKET_KEY}
    add_missing(tmp_path)
    assert len(creds.ticket_key()) >= 32 and stat.S_IMODE((tmp_path / TICKET_KEY).stat().st_mode) == 0o600
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != TICKET_KEY} == before
    assert added_items(p.name for p in tmp_path.iterdir()) == {}
