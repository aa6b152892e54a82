"""free_port: ports picked outside the kernel's ephemeral range (which bind(0) and outgoing connections draw from),
so nothing but another picker can take one between the pick and the caller's bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rlboost import nats_server
from rlboost.nats_server import DEFAULT_EPHEMERAL_RANGE, ephemeral_port_range, free_port, pick_range


def test_the_ephemeral_range_is_read_and_falls_back_when_unreadable_or_odd(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ephemeral_port_range(path) == (40000, 50000)
    for bad in ("", "40000", "a b", "50000 40000", "0 100", "1000 70000"):
        path.write_text(bad)
        assert ephemeral_port_range(path) == DEFAULT_EPHEMERAL_RANGE, bad
    assert ephemeral_port_range(tmp_path / "missing") == DEFAULT_EPHEMERAL_RANGE


def test_ports_come_from_below_the_range_else_above_it_and_never_privileged() -> None:
    assert pick_range((32768, 60999)) == (20000, 32767)  # Linux's default
    assert pick_range((15000, 60999)) == (1025, 14999)  # too little room above 20000: from the first unprivileged
    assert pick_range((1500, 60000)) == (60001, 65535)  # 475 below, 5535 above: above
    assert pick_range((1025, 65000)) == (65001, 65535)  # nothing below: above, though small
    assert pick_range((1025, 65400)) == (65401, 65535)
    assert pick_range((1100, 65500)) == (1025, 1099)  # neither side roomy: the larger
    assert pick_range((1025, 65535)) is None  # no port outside: the kernel picks
    assert pick_range((1, 60999)) == (61000, 65535)


def test_many_picks_are_free_distinct_and_outside_the_ephemeral_range() -> None:
    first, last = ephemeral_port_range()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)  # a process never hands out a port twice in a row of picks
    assert not any(first <= p <= last for p in ports)
    assert all(1024 < p <= 65535 for p in ports)
    for port in ports[:20]:  # free: a listener can bind each
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pick range narrowed to ten ports (monkeypatched: the real one is thousands wide), one of them held."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(nats_server, "pick_range", lambda _ephemeral: (taken, taken + 9))
        monkeypatch.setattr(nats_server, "_recent", nats_server.collections.deque(maxlen=100))
        picks = {free_port() for _ in range(9)}
        assert taken not in picks and picks <= set(range(taken + 1, taken + 10))


def test_no_free_port_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(nats_server, "pick_range", lambda _ephemeral: (taken, taken))
        with pytest.raises(RuntimeError, match=rf"no free TCP port on 127.0.0.1 among {taken}-{taken} .*ephemeral"):
            free_port()
