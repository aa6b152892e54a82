"""Spot traces (Bamboo format), their replay schedule, the pool reconcile step and the chaos monkey."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlboost.local.chaos import ChaosMonkey
from rlboost.local.spot_trace import TraceError, TraceSchedule, load_trace, parse_trace, reconcile
from rlboost.wire.rollout_io import ManagerStatus, Pool, WorkerStatus

BAMBOO = Path(__file__).resolve().parents[2] / "traces" / "bamboo"


def test_parse_crlf_header_comments_and_same_second_steps() -> None:
    text = "seconds,instances\r\n# a comment\r\n0,0\r\n100,0\r\n100,4\r\n\r\n250,2\r\n"
    trace = parse_trace(text)
    assert trace.times == (0.0, 100.0, 250.0)
    assert trace.counts == (0, 4, 2)  # the second event at t=100 wins
    assert [trace.count_at(t) for t in (0, 99.9, 100, 249, 250, 10**6)] == [0, 0, 4, 4, 2, 2]


def test_bad_lines_name_the_line() -> None:
    with pytest.raises(TraceError, match=r"x.csv:2: expected 'seconds,instances'"):
        parse_trace("0,1\nabc\n", "x.csv")
    with pytest.raises(TraceError, match=r":3: time 5.0 goes backwards"):
        parse_trace("0,1\n10,2\n5,3\n")
    with pytest.raises(TraceError, match="no 'seconds,instances' lines"):
        parse_trace("\n# only a comment\n")
    with pytest.raises(TraceError, match="file not found"):
        load_trace("/nonexistent/trace.csv")


@pytest.mark.skipif(not BAMBOO.exists(), reason="shared Bamboo traces not present")
def test_every_shared_bamboo_trace_parses() -> None:
    files = sorted(BAMBOO.glob("*.csv"))
    assert files
    for f in files:
        trace = load_trace(f)
        assert trace.times[0] == 0 and list(trace.times) == sorted(trace.times)
        assert 0 <= max(trace.counts) <= 16
    g4dn = load_trace(BAMBOO / "aws-spot-instances-g4dn-xlarge-us-east-1c-2020-11-20-1930-to-2020-11-21-2200.csv")
    assert g4dn.count_at(0) == 0 and g4dn.count_at(21529) == 4 and g4dn.count_at(88194) == 7


def test_schedule_scales_time_and_clamps_to_pool_bounds() -> None:
    trace = parse_trace("0,1\n100,9\n200,0\n")
    sched = TraceSchedule(trace, time_scale=100.0, min_replicas=1, max_replicas=3)
    assert not sched.by_progress
    assert [sched.target(sched.trace_seconds(wall, samples_finished=999)) for wall in (0.0, 1.0, 2.5)] == [1, 3, 1]
    with pytest.raises(TraceError, match="--trace-time-scale"):
        TraceSchedule(trace, time_scale=0)


def test_schedule_by_progress_ignores_the_wall_clock() -> None:
    """With step_seconds the trace advances by finished samples: a fast or slow machine hits the same events."""
    trace = parse_trace("0,0\n108,2\n299,0\n")
    sched = TraceSchedule(trace, step_seconds=100.0, samples_per_step=16, max_replicas=2)
    assert sched.by_progress
    assert sched.trace_seconds(wall_elapsed_s=1e6, samples_finished=0) == 0.0
    # 16 samples a step: step 1 done -> 100 s (still 0), 1.125 steps -> 112.5 s (2), 3 steps -> 300 s (0)
    assert [sched.target(sched.trace_seconds(0.0, n)) for n in (0, 16, 18, 47, 48)] == [0, 0, 2, 2, 0]
    with pytest.raises(TraceError, match="--trace-step-seconds"):
        TraceSchedule(trace, step_seconds=0)


def test_reconcile_kills_newest_first_and_never_reuses_ids() -> None:
    assert reconcile(["spot-0", "spot-1", "spot-4"], 1, 5) == (["spot-4", "spot-1"], [])
    assert reconcile(["spot-0"], 3, 5) == ([], ["spot-5", "spot-6"])
    assert reconcile(["spot-0"], 1, 5) == ([], [])


def _status(**inflight: int) -> ManagerStatus:
    """A manager status with spot workers (spot_1=5: spot-1 holds 5 tokens in flight)."""
    workers = [
        WorkerStatus(
            worker_id=w.replace("_", "-"),
            pool=Pool.SPOT,
            node="n",
            weight_version=1,
            running=1,
            capacity=8,
            tokens_generated=n,
            draining=False,
            inflight_tokens=n,
        )
        for w, n in inflight.items()
    ]
    return ManagerStatus(workers=workers, pending=0, running=len(workers), finished=0, migrations=0, tokens_received=0)


def test_chaos_kills_only_a_worker_streaming_an_unfinished_response() -> None:
    """Armed from the start; a victim only among live workers with tokens in flight (never an idle one, never
    one the status does not show, never blind without a status); then disarmed for a full period."""
    monkey = ChaosMonkey(period_s=2.0, seed=3)
    assert monkey.armed(0.0)
    live = {"spot": ["spot-1", "spot-2", "spot-3"]}
    assert monkey.pick(live, None) is None  # no status: wait
    assert monkey.pick(live, _status(spot_1=0, spot_2=0)) is None  # idle (or running but silent): wait
    assert monkey.pick(live, _status(spot_1=0, spot_2=5, spot_9=7)).name == "spot-2"  # spot-9 is not live
    monkey.fire(100.0)
    assert [monkey.armed(t) for t in (100.0, 101.9, 102.0)] == [False, False, True]
    with pytest.raises(ValueError, match="--chaos-kill-every"):
        ChaosMonkey(period_s=0)
