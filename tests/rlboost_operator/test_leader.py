"""Leader election (rlboost_operator/leader.py and __main__.py).

- The decisions, pure: lease record + observation time + identity -> acquire / renew / wait.
- The I/O layer (LeaderElector over the operator's Kube client) against kmock's Kubernetes emulator,
  which the conftest extends with the API server's optimistic concurrency for Leases (kmock has no
  PUT and no resourceVersion of its own; see conftest.py).
- Two real operator processes against one API: only the Lease holder reconciles; the standby takes
  over within the lease duration after the leader is SIGKILLed; a leader that loses the Lease exits 1.
- With a reconcile in flight (held by kmock at the cluster's key discovery): a SIGTERM still stops the
  leader with exit 0 and releases the Lease; a lost Lease cancels the reconcile at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import kopf
import pytest

from rlboost.nats_server import free_port
from rlboost_operator.__main__ import election_config, parse_args
from rlboost_operator.kube import Kube
from rlboost_operator.leader import (
    Decision,
    ElectionConfig,
    LeaderElector,
    LeadershipLostError,
    LeaseRecord,
    Observation,
    decide,
    micro_time,
    new_identity,
    next_record,
    observe,
    released,
    still_leading,
)
from tests.helpers import wait_until
from tests.rlboost_operator.test_operator import NS, rljob, status_of

T0 = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def held(holder: str, duration: int = 15, renewed: str = "2025-01-02T03:04:05.000000Z") -> LeaseRecord:
    return LeaseRecord(holder, duration, acquire_time=renewed, renew_time=renewed, transitions=3)


# --- Pure decisions ------------------------------------------------------------------------------


def test_an_absent_or_released_lease_is_acquired_and_an_own_lease_renewed():
    assert decide(None, "me", now=0.0) is Decision.ACQUIRE
    assert decide(Observation(held(""), since=100.0), "me", now=100.0) is Decision.ACQUIRE
    assert decide(Observation(held("me"), since=0.0), "me", now=1000.0) is Decision.RENEW


def test_another_holder_is_waited_for_until_its_record_stays_unchanged_for_a_lease_duration():
    seen = Observation(held("other", duration=15), since=100.0)
    assert decide(seen, "me", now=100.0) is Decision.WAIT
    assert decide(seen, "me", now=114.9) is Decision.WAIT
    assert decide(seen, "me", now=115.0) is Decision.ACQUIRE


def test_a_renewing_holder_restarts_the_expiry_clock_and_an_unchanged_record_does_not():
    first = observe(None, held("other"), now=10.0)
    assert observe(first, held("other"), now=20.0) is first  # same record: the clock keeps running
    renewed = observe(first, held("other", renewed="2025-01-02T03:04:07.000000Z"), now=20.0)
    assert renewed.since == 20.0
    assert decide(renewed, "me", now=30.0) is Decision.WAIT  # expired by the first sighting, not by this one


def test_expiry_uses_the_candidates_clock_not_the_record_timestamps():
    """A renewTime far in the past (clock skew between nodes) does not make a live lease look expired."""
    skewed = held("other", renewed="2001-01-01T00:00:00.000000Z")
    assert decide(observe(None, skewed, now=50.0), "me", now=51.0) is Decision.WAIT


def test_taking_a_lease_counts_a_transition_and_renewing_keeps_the_acquire_time():
    taken = next_record(held("other"), "me", 15, T0)
    assert taken == LeaseRecord("me", 15, micro_time(T0), micro_time(T0), transitions=4)
    later = T0 + timedelta(seconds=2)
    renewed = next_record(taken, "me", 15, later)
    assert renewed == LeaseRecord("me", 15, micro_time(T0), micro_time(later), transitions=4)
    assert next_record(None, "me", 15, T0).transitions == 0


def test_released_lease_has_no_holder_and_a_one_second_duration():
    record = released(held("me"), T0)
    assert (record.holder, record.lease_duration_s, record.transitions) == ("", 1, 3)
    assert decide(Observation(record, since=0.0), "other", now=0.0) is Decision.ACQUIRE


def test_leader_steps_down_after_the_renew_deadline():
    assert still_leading(last_renewed=10.0, now=19.9, renew_deadline_s=10)
    assert not still_leading(last_renewed=10.0, now=20.0, renew_deadline_s=10)


def test_lease_record_round_trips_through_a_lease_and_micro_time_is_rfc3339_utc():
    assert micro_time(T0) == "2025-01-02T03:04:05.678901Z"
    record = held("me")
    assert LeaseRecord.from_lease({"spec": record.spec()}) == record
    assert LeaseRecord.from_lease({"spec": {}}) == LeaseRecord("", 0)


def test_identity_is_the_pod_name_plus_a_random_suffix(monkeypatch):
    monkeypatch.setenv("POD_NAME", "rlboost-operator-7d9f-abcde")
    one, two = new_identity(), new_identity()
    assert one.startswith("rlboost-operator-7d9f-abcde_") and one != two


def test_election_settings_must_be_ordered_and_bad_flags_exit_naming_the_flag():
    with pytest.raises(ValueError, match="lease duration"):
        ElectionConfig(identity="me", lease_duration_s=5, renew_deadline_s=10, retry_period_s=2)
    with pytest.raises(SystemExit, match="--lease-duration"):
        election_config(parse_args(["--lease-duration", "0"]), None)
    with pytest.raises(SystemExit, match="renew deadline"):
        election_config(parse_args(["--renew-deadline", "30"]), None)


def test_flags_choose_the_lease_and_standalone_turns_election_off(monkeypatch):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    args = parse_args([])
    assert args.leader_elect is True
    assert election_config(args, "from-credentials").lease_namespace == "from-credentials"
    assert election_config(args, None).lease_namespace == "default"
    monkeypatch.setenv("POD_NAMESPACE", "rlboost-system")
    assert election_config(args, None).lease_namespace == "rlboost-system"
    config = election_config(parse_args(["--lease-name", "op", "--lease-namespace", "ops"]), None)
    assert (config.lease_name, config.lease_namespace) == ("op", "ops")
    assert parse_args(["--standalone"]).leader_elect is False
    assert parse_args(["--no-leader-elect"]).leader_elect is False


# --- The I/O layer against kmock ---------------------------------------------------------------


def elector(api, name: str, lease_duration_s: int = 1) -> LeaderElector:
    kube = Kube(kopf.ConnectionInfo(server=api.url, token="test"))
    config = ElectionConfig(
        identity=name,
        lease_namespace=NS,
        lease_duration_s=lease_duration_s,
        renew_deadline_s=lease_duration_s * 0.75,
        retry_period_s=0.05,
    )
    return LeaderElector(kube, config)


def lease(api) -> dict:
    return api.get("Lease", NS, "rlboost-operator") or {}


async def test_concurrent_candidates_exactly_one_wins_the_new_lease(kube_api):
    a, b = elector(kube_api, "a"), elector(kube_api, "b")
    try:
        results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
        assert sorted(results) == [False, True]
        winner = "a" if results[0] else "b"
        assert lease(kube_api)["spec"]["holderIdentity"] == winner
        # Whether the loser's create got 409 or it read the winner's lease first: it waits, the winner renews.
        assert await a.try_acquire_or_renew() is (winner == "a")
        assert await b.try_acquire_or_renew() is (winner == "b")
    finally:
        await asyncio.gather(a.kube.close(), b.kube.close())


async def test_stale_write_is_refused_with_409(kube_api):
    a = elector(kube_api, "a")
    try:
        assert await a.try_acquire_or_renew()
        stale = lease(kube_api)
        assert await a.try_acquire_or_renew()  # a renewal moves the resourceVersion on
        stale["spec"]["holderIdentity"] = "thief"
        resp = kube_api.http.put(kube_api.path("Lease", NS, "rlboost-operator"), json=stale)
        assert resp.status_code == 409
        assert lease(kube_api)["spec"]["holderIdentity"] == "a"
    finally:
        await a.kube.close()


async def test_standby_takes_an_unrenewed_lease_after_its_duration_and_counts_a_transition(kube_api):
    a, b = elector(kube_api, "a"), elector(kube_api, "b")
    try:
        await a.acquire()
        started = time.monotonic()
        await asyncio.wait_for(b.acquire(), timeout=10)  # a never renews
        assert time.monotonic() - started >= 1.0  # not before a whole lease duration
        spec = lease(kube_api)["spec"]
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
        # The old leader notices at its next renewal and steps down.
        with pytest.raises(LeadershipLostError, match="held by b"):
            await asyncio.wait_for(a.keep(), timeout=10)
    finally:
        await asyncio.gather(a.kube.close(), b.kube.close())


async def test_a_leader_that_cannot_reach_the_api_steps_down_at_the_renew_deadline(kube_api):
    a = elector(kube_api, "a")
    try:
        await a.acquire()
        a.kube.server = f"http://127.0.0.1:{free_port()}"  # the API server becomes unreachable
        started = time.monotonic()
        with pytest.raises(LeadershipLostError, match="no renewal succeeded"):
            await asyncio.wait_for(a.keep(), timeout=10)
        assert time.monotonic() - started >= a.config.renew_deadline_s
    finally:
        await a.kube.close()


async def test_renewals_keep_a_standby_waiting_and_a_release_hands_the_lease_over_at_once(kube_api):
    """Round by round (a 30 s lease, so the machine's load cannot expire it): each renewal is a new record,
    which restarts the standby's expiry clock; after a release the standby's next round takes the Lease."""
    a, b = elector(kube_api, "a", lease_duration_s=30), elector(kube_api, "b", lease_duration_s=30)
    try:
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        first_seen = b.observed.since
        assert await a.try_acquire_or_renew()  # renewal
        assert not await b.try_acquire_or_renew()
        assert b.observed.since > first_seen and b.observed.record.holder == "a"
        await a.release()
        assert lease(kube_api)["spec"]["holderIdentity"] == ""
        assert await b.try_acquire_or_renew()
        spec = lease(kube_api)["spec"]
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    finally:
        await asyncio.gather(a.kube.close(), b.kube.close())


async def test_a_release_after_losing_the_lease_leaves_the_new_holder_alone(kube_api):
    a, b = elector(kube_api, "a"), elector(kube_api, "b")
    try:
        await a.acquire()
        await asyncio.wait_for(b.acquire(), timeout=10)  # a never renewed: b took it at expiry
        await a.release()
        assert lease(kube_api)["spec"]["holderIdentity"] == "b"
    finally:
        await asyncio.gather(a.kube.close(), b.kube.close())


# --- Two real operator processes ------------------------------------------------------------------

# The renew deadline (LEASE_S - 1) must outlast the slowest renewal on a busy 2-core machine: with 4 s (a 3 s
# deadline) a new leader's renewal (a GET and a PUT to kmock, competing with its first reconciles) once took
# over 2.5 s under a load of 5, so it stepped down and exited 1 as designed, failing the test's clean stop.
LEASE_S = 8
POLL_S = 0.1  # kmock serves from this process: polling it every 20 ms would slow the operators down


class OperatorProcess:
    """`python -m rlboost_operator` with leader election, its own metrics and liveness ports, logging to a file."""

    def __init__(self, pod: str, log_dir: Path) -> None:
        self.pod, self.log = pod, log_dir / f"{pod}.log"
        self.metrics_port, self.liveness_port = free_port(), free_port()
        args = ["--metrics-port", str(self.metrics_port), "--liveness-port", str(self.liveness_port)]
        args += ["--leader-elect", "--lease-namespace", NS, "--lease-duration", str(LEASE_S)]
        args += ["--renew-deadline", str(LEASE_S - 1), "--retry-period", "0.5", "--log-level", "DEBUG"]
        with self.log.open("w") as out:
            env = {**os.environ, "POD_NAME": pod}
            self.proc = subprocess.Popen([sys.executable, "-m", "rlboost_operator", *args], stderr=out, env=env)

    def metric(self, name: str) -> float | None:
        """A sample's value on this process's /metrics (None while it is not serving; 0 if absent)."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        except httpx.TransportError:
            return None
        found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def live(self) -> bool:
        """Whether the liveness probe passes (the standby's own /healthz, or kopf's once leading)."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=10).status_code == 200
        except httpx.TransportError:
            return False

    def leading(self) -> float | None:
        return self.metric("rlboost_operator_leader")

    def reconciled(self) -> float | None:
        return self.metric('rlboost_operator_reconciliations_total{result="ok"}')

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def start_operator(kube_api, nats_server, monkeypatch, tmp_path) -> Iterator:
    monkeypatch.setenv("RLBOOST_OPERATOR_NATS_URL", nats_server.url)
    started: list[OperatorProcess] = []

    def start(pod: str) -> OperatorProcess:
        started.append(OperatorProcess(pod, tmp_path))
        return started[-1]

    yield start
    for proc in started:
        proc.stop()
        print(logs(proc))  # shown by pytest when the test failed


def scraped(read: Callable[[], float | None]) -> float:
    """A metric's value once the process answers the scrape (None meant: not answering yet)."""
    return wait_until(lambda: (value := read()) is not None and [value], timeout=30, interval=POLL_S, what="a scrape")[
        0
    ]


def holder(api) -> str:
    return (lease(api).get("spec") or {}).get("holderIdentity") or ""


def logs(*procs: OperatorProcess, lines: int = 40) -> str:
    """Each process's last log lines, each cut short: kopf's lines carry its whole settings, and a tail of the
    raw file held only two of them, hiding e.g. the election's 'lost the lease' just before."""
    return "\n".join(
        f"--- {p.pod}\n" + "\n".join(line[:400] for line in p.log.read_text().splitlines()[-lines:]) for p in procs
    )


def test_only_the_leader_reconciles_and_a_standby_takes_over_when_it_is_killed(kube_api, start_operator):
    api = kube_api
    a = start_operator("op-a")
    wait_until(lambda: a.leading() == 1, timeout=60, interval=POLL_S, what="op-a leading")
    b = start_operator("op-b")
    wait_until(lambda: b.leading() == 0, timeout=60, interval=POLL_S, what="op-b up and standing by")
    assert holder(api).startswith("op-a_")
    wait_until(b.live, timeout=30, interval=POLL_S, what="op-b's liveness probe passing while it stands by")

    api.create("RLJob", rljob("first"))
    wait_until(
        lambda: status_of(api, "first").get("phase") == "Pending", timeout=60, interval=POLL_S, what="first reconciled"
    )
    assert scraped(a.reconciled) >= 1
    assert (scraped(b.reconciled), scraped(b.leading)) == (0, 0)

    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(10)
    killed = time.monotonic()
    wait_until(lambda: b.leading() == 1, timeout=LEASE_S + 15, interval=POLL_S, what="op-b taking over")
    print(f"takeover {time.monotonic() - killed:.2f} s after SIGKILL (lease {LEASE_S} s)")
    spec = lease(api)["spec"]
    assert spec["holderIdentity"].startswith("op-b_") and spec["leaseTransitions"] == 1

    api.create("RLJob", rljob("second"))
    wait_until(
        lambda: status_of(api, "second").get("phase") == "Pending",
        timeout=30,
        interval=POLL_S,
        what="second reconciled",
    )
    assert scraped(b.reconciled) >= 1

    b.proc.send_signal(signal.SIGTERM)  # a clean stop hands the Lease over
    assert b.proc.wait(30) == 0, logs(b)
    assert holder(api) == ""


def leading_in_a_held_reconcile(api, start_operator: Callable[[str], OperatorProcess]) -> OperatorProcess:
    """op-a leading, with an RLJob's reconcile waiting on the cluster's key discovery, which kmock holds."""
    api.discovery.gate = threading.Event()
    a = start_operator("op-a")
    wait_until(lambda: a.leading() == 1, timeout=60, interval=POLL_S, what="op-a leading")
    api.create("RLJob", rljob("held"))
    wait_until(lambda: api.discovery.held >= 1, timeout=60, interval=POLL_S, what="the reconcile waiting on the API")
    return a


def test_a_sigterm_during_a_reconcile_stops_the_leader_cleanly_and_releases_the_lease(kube_api, start_operator):
    """The reconcile waits on the API server's key discovery, which kmock holds unanswered (the gate): the
    SIGTERM must cancel it, exit 0 and hand the Lease over; the next leader redoes the reconcile."""
    api = kube_api
    a = leading_in_a_held_reconcile(api, start_operator)

    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(30) == 0, logs(a)
    assert "is cancelled" in a.log.read_text(), logs(a)  # it stopped mid-reconcile, not after it
    assert holder(api) == ""


def steal(api) -> bool:
    """Write another holder into the Lease, as a replica that took it would; False on a 409 (a renewal won)."""
    current = lease(api)
    current["spec"].update(holderIdentity="intruder", leaseDurationSeconds=60)
    return api.http.put(api.path("Lease", NS, "rlboost-operator"), json=current).status_code == 200


def test_a_leader_that_loses_the_lease_stops_and_exits_non_zero(kube_api, start_operator):
    api = kube_api
    a = start_operator("op-a")
    wait_until(lambda: a.leading() == 1, timeout=60, interval=POLL_S, what="op-a leading")

    wait_until(lambda: steal(api), timeout=10, interval=POLL_S, what="the lease taken by another holder")
    assert a.proc.wait(15) == 1, logs(a)
    assert "lost the lease" in a.log.read_text()
    assert holder(api) == "intruder"  # the loser does not write the Lease on its way out


def test_a_leader_that_loses_the_lease_cancels_its_reconciles_at_once(kube_api, start_operator):
    """A reconcile held by the API (kmock's discovery gate) is cancelled as the Lease is lost, not after kopf's
    exit timeout (2 s, in which its workers would go on handling queued events: acting without the Lease)."""
    api = kube_api
    a = leading_in_a_held_reconcile(api, start_operator)

    wait_until(lambda: steal(api), timeout=10, interval=POLL_S, what="the lease taken by another holder")
    assert a.proc.wait(15) == 1, logs(a)
    lost, cancelled = (logged_at(a, text) for text in ("lost the lease", "Handler 'rljob_reconcile' is cancelled"))
    assert 0 <= cancelled - lost < 1.5, logs(a)  # kopf's exit timeout alone is 2 s


def logged_at(proc: OperatorProcess, text: str) -> float:
    """The time of the first log record whose message contains `text`."""
    records = (json.loads(line) for line in proc.log.read_text().splitlines() if line.startswith("{"))
    return next(r["ts"] for r in records if text in r["msg"])
