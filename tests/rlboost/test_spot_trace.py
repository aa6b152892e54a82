"""Spot traces (Bamboo format), their replay schedule, the pool reconcile step and the chaos monkey."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlboost.local.chaos import ChaosMonkey
from rlboost.local.spot_trace import TraceError, TraceSchedule, load_trace, parse_trace, reconcile

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
    assert sched.target(0.0) == 1
    assert sched.target(1.0) == 3  # 9 clamped to max
    assert sched.target(2.5) == 1  # 0 clamped to min
    with pytest.raises(TraceError, match="--trace-time-scale"):
        TraceSchedule(trace, time_scale=0)


def test_reconcile_kills_newest_first_and_never_reuses_ids() -> None:
    assert reconcile(["spot-0", "spot-1", "spot-4"], 1, 5) == (["spot-4", "spot-1"], [])
    assert reconcile(["spot-0"], 3, 5) == ([], ["spot-5", "spot-6"])
    assert reconcile(["spot-0"], 1, 5) == ([], [])


def test_chaos_fires_once_per_period_and_picks_a_live_worker() -> None:
    monkey = ChaosMonkey(period_s=2.0, seed=3)
    monkey.start(100.0)
    assert [monkey.due(t) for t in (100.0, 101.9, 102.0, 102.5, 104.0)] == [False, False, True, False, True]
    assert monkey.pick(["spot-1", "spot-2"]) in {"spot-1", "spot-2"}
    assert monkey.pick([]) is None
    with pytest.raises(ValueError, match="--chaos-kill-every"):
        ChaosMonkey(period_s=0)
