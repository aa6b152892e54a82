"""The source directory of peer fan-out (rlboost.weights.peers): source ordering, relays, re-choice (pure)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlboost.weights.peers import Peer, PeerDirectory, order_sources
from rlboost.wire.peers_io import PeerRegistration, SourcesRequest

PATH = "/versions/3/payload"


def peer(worker: str, zone: str, region: str, holds: tuple[str, ...] = ()) -> Peer:
    return Peer(worker, f"http://{worker}:1", zone, region, 0.0, frozenset(holds))


def join(d: PeerDirectory, worker: str, zone: str, region: str, now: float = 0.0, holds: list[str] | None = None):
    d.register(worker, PeerRegistration(url=f"http://{worker}:1", zone=zone, region=region, holds=holds or []), now)


def test_holders_in_the_zone_come_before_the_region_and_the_server_is_last():
    me = peer("me", "a1", "a")
    holders = [peer("far", "b1", "b", (PATH,)), peer("region", "a2", "a", (PATH,)), peer("zone", "a1", "a", (PATH,))]
    found = order_sources(me, holders, [], max_peers=4)
    assert [(s.worker, s.tier) for s in found.sources] == [("zone", "zone"), ("region", "region"), ("", "server")]
    assert not found.relay


def test_peers_of_another_region_are_never_offered():
    found = order_sources(peer("me", "a1", "a"), [peer("far", "b1", "b", (PATH,))], [peer("far2", "b2", "b")], 4)
    assert [s.tier for s in found.sources] == ["server"] and found.relay


def test_a_puller_behind_another_in_its_region_pulls_from_the_nearest_one_ahead():
    ahead = [peer("first", "a1", "a"), peer("other-region", "b1", "b"), peer("second", "a2", "a")]
    found = order_sources(peer("me", "a1", "a"), [], ahead, 4)
    assert [(s.worker, s.complete) for s in found.sources] == [("second", False), ("", True)]


def test_max_peers_bounds_the_peer_sources():
    holders = [peer(f"h{i}", "a1", "a", (PATH,)) for i in range(10)]
    assert len(order_sources(peer("me", "a1", "a"), holders, [], 3).sources) == 4  # three peers and the server


def test_pullers_spread_over_the_holders():
    holders = [peer(f"h{i}", "a1", "a", (PATH,)) for i in range(4)]
    firsts = {order_sources(peer(f"me{i}", "a1", "a"), holders, [], 4).sources[0].worker for i in range(40)}
    assert len(firsts) > 1


def test_the_first_puller_of_each_region_is_its_relay_and_the_rest_chain_behind_it():
    d = PeerDirectory()
    for w, zone, region in [
        ("a0", "a1", "a"),
        ("b0", "b1", "b"),
        ("a1", "a2", "a"),
        ("a2", "a1", "a"),
        ("b1", "b1", "b"),
    ]:
        join(d, w, zone, region)
    answers = {w: d.sources(w, PATH, 1.0) for w in ["a0", "b0", "a1", "a2", "b1"]}
    assert answers["a0"].relay and answers["b0"].relay
    assert [s.worker for s in answers["a1"].sources] == ["a0", ""]
    assert [s.worker for s in answers["a2"].sources] == ["a1", ""]
    assert [s.worker for s in answers["b1"].sources] == ["b0", ""]
    assert d.relays(PATH) == {"a": "a0", "b": "b0"}


def test_asking_again_keeps_the_place_in_the_chain():
    d = PeerDirectory()
    join(d, "a0", "z", "r")
    join(d, "a1", "z", "r")
    d.sources("a0", PATH, 0.0)
    d.sources("a1", PATH, 0.0)
    assert d.sources("a0", PATH, 0.0).relay
    assert [s.worker for s in d.sources("a1", PATH, 0.0).sources] == ["a0", ""]


def test_a_relay_that_leaves_or_stops_heartbeating_is_replaced_by_the_next_puller():
    d = PeerDirectory(ttl_s=30)
    for w in ("a0", "a1", "a2"):
        join(d, w, "z", "r")
        d.sources(w, PATH, 0.0)
    d.leave("a0")
    assert d.sources("a1", PATH, 1.0).relay
    assert d.relays(PATH) == {"r": "a1"}
    join(d, "a2", "z", "r", now=40.0)  # a2 heartbeats, a1 does not
    assert d.sources("a2", PATH, 40.0).relay
    assert "a1" not in d.peers


def test_a_worker_holding_the_payload_is_a_holder_not_a_link_of_the_chain():
    d = PeerDirectory()
    join(d, "a0", "z", "r")
    d.sources("a0", PATH, 0.0)
    join(d, "a0", "z", "r", holds=[PATH])
    join(d, "a1", "z", "r")
    assert [(s.worker, s.complete) for s in d.sources("a1", PATH, 0.0).sources] == [("a0", True), ("", True)]


def test_a_peer_reported_stalled_is_offered_to_no_one_until_it_heartbeats_again():
    d = PeerDirectory()
    join(d, "frozen", "z", "r", holds=[PATH])
    join(d, "link", "z", "r")
    join(d, "a0", "z", "r")
    d.sources("link", PATH, 0.0)
    assert not d.report_stalled("stranger", "frozen") and not d.report_stalled("a0", "a0")  # registered, not itself
    assert d.report_stalled("a0", "frozen") and d.report_stalled("a0", "link")
    join(d, "a1", "z", "r")
    assert d.sources("a1", PATH, 1.0).relay  # neither the stalled holder nor the stalled chain link
    join(d, "frozen", "z", "r", now=2.0, holds=[PATH])  # it heartbeats: alive after all
    assert [s.worker for s in d.sources("a1", PATH, 2.0).sources] == ["frozen", ""]


def test_an_unregistered_puller_is_sent_to_the_weight_server():
    found = PeerDirectory().sources("stranger", PATH, 0.0)
    assert found.relay and [s.tier for s in found.sources] == ["server"]


@pytest.mark.parametrize(
    ("model", "body", "field"),
    [
        (PeerRegistration, {"url": "ftp://x:1"}, "url"),
        (PeerRegistration, {"url": "http://x:1", "zone": "a b"}, "zone"),
        (PeerRegistration, {"url": "http://x:1", "holds": ["/etc/passwd"]}, "holds"),
        (SourcesRequest, {"worker": "w", "path": "/versions/../payload"}, "path"),
        (SourcesRequest, {"worker": "", "path": PATH}, "worker"),
    ],
)
def test_bad_registrations_and_questions_name_the_field(model, body, field):
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    assert err.value.errors()[0]["loc"][0] == field
