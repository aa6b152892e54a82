"""rlboost.gc_pauses: each collection's pause is recorded by generation; start-up's objects leave later collections."""

from __future__ import annotations

import gc

from prometheus_client import REGISTRY

from rlboost import gc_pauses


def _full_collections() -> float:
    return REGISTRY.get_sample_value("rlboost_gc_pause_seconds_count", {"generation": "2"}) or 0.0


def test_every_full_collection_is_timed_once_however_often_watch_is_called():
    gc_pauses.watch()
    gc_pauses.watch()
    before = _full_collections()
    gc.collect()
    assert _full_collections() == before + 1
    assert gc.callbacks.count(gc_pauses._on_collection) == 1


def test_objects_alive_after_start_up_are_left_out_of_collections():
    kept = [[i] for i in range(1000)]  # containers alive at "start-up"
    try:
        frozen = gc_pauses.freeze_after_start()
        assert frozen >= len(kept) and gc.get_freeze_count() == frozen
        assert not any(gc.is_tracked(k) and any(o is k for o in gc.get_objects(2)) for k in kept[:3])
    finally:
        gc.unfreeze()  # this test process goes on collecting them
