"""The trainer's colocation handshake (trainer.colocateReserved) over a real nats-server.

Unit: trainer.colocation.Colocation against acking peers written in the test (the real workers are separate
processes; tests/rollout_worker/test_colocation_worker.py covers their side). Process: `python -m trainer`
colocated with one reserved worker played by the test on NATS, against the stand-in manager (peers.py):
each step releases after its rollout and before training, and resumes after the new weights are announced.
"""

from __future__ import annotations

import asyncio

import nats
import pytest
from prometheus_client import REGISTRY

from rlboost.auth.colocation_acks import AckVerifier, sign, worker_ack_key
from rlboost.models import load_tokenizer, stop_token_ids
from rlboost.spec import dump_job_spec
from rlboost.wire.events import (
    COLOCATION,
    COLOCATION_ACKS,
    STEPS,
    WEIGHTS,
    ColocationAck,
    ColocationCommand,
    StepReport,
    WeightsAnnounced,
)
from tests.trainer.conftest import tiny_spec
from tests.trainer.peers import StandInManager, WeightServerProcess, child_env, start_manager, wait_process
from trainer.colocation import Colocation


async def fake_workers(
    nc, job: str, ids: list[str], ok: bool = True, keys: dict[str, str] | None = None
) -> list[ColocationCommand]:
    """Colocated workers that ack every command at once, each MACed with `keys[id]` (the ack key the manager would
    give; none: unsigned); returns the list the commands are recorded in."""
    seen: list[ColocationCommand] = []

    async def on_command(msg) -> None:
        cmd = ColocationCommand.model_validate_json(msg.data)
        seen.append(cmd)
        for wid in ids:
            ack = ColocationAck(
                step=cmd.step,
                action=cmd.action,
                worker_id=wid,
                ok=ok,
                error="" if ok else "EngineError: boom",
                released=cmd.action == "release",
                nbytes=10,
            )
            sign(ack, (keys or {}).get(wid, ""))
            await nc.publish(COLOCATION_ACKS.subject("default", job), ack.model_dump_json().encode())

    await nc.subscribe(COLOCATION.subject("default", job), cb=on_command)
    await nc.flush()
    return seen


def counter(name: str, action: str) -> float:
    return REGISTRY.get_sample_value(name, {"action": action}) or 0.0


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("rlboost_trainer_colocation_acks_refused_total", {"reason": reason}) or 0.0


async def test_release_and_resume_wait_for_every_worker(nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        seen = await fake_workers(nc, "c1", ["reserved-0", "reserved-1"])
        colo = Colocation(nc, "default", "c1", workers=2, timeout_s=10)
        await colo.start()
        rel = await colo.release(3, version=3)
        res = await colo.resume(3, version=4)
        assert (rel.acked, res.acked, rel.failed) == (2, 2, [])
        assert [(c.step, c.action, c.weight_version) for c in seen] == [(3, "release", 3), (3, "resume", 4)]
    finally:
        await nc.close()


async def test_missing_ack_times_out_and_training_goes_on(nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        await fake_workers(nc, "c2", ["reserved-0"])  # the job has two reserved workers: one is gone
        colo = Colocation(nc, "default", "c2", workers=2, timeout_s=0.5)
        await colo.start()
        before = counter("rlboost_trainer_colocation_timeouts_total", "release")
        rel = await colo.release(0, version=0)
        assert rel.acked == 1 and 0.5 <= rel.wait_seconds < 5
        assert counter("rlboost_trainer_colocation_timeouts_total", "release") == before + 1
    finally:
        await nc.close()


async def test_a_worker_that_subscribes_late_gets_the_command_again(nats_server):
    """A reserved worker still starting when the first step's rollout (run by spot workers) ended."""
    nc = await nats.connect(nats_server.url)
    try:
        colo = Colocation(nc, "default", "c4", workers=1, timeout_s=30)
        await colo.start()
        release = asyncio.create_task(colo.release(0, version=0))
        first = await nc.subscribe(COLOCATION.subject("default", "c4"))
        await first.next_msg(timeout=10)  # the command went out while no worker listened
        await first.unsubscribe()
        seen = await fake_workers(nc, "c4", ["reserved-0"])
        rel = await asyncio.wait_for(release, 10)
        assert rel.acked == 1 and rel.wait_seconds < 10 and seen[0].action == "release"
    finally:
        await nc.close()


async def test_failed_ack_is_reported(nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        await fake_workers(nc, "c3", ["reserved-0"], ok=False)
        colo = Colocation(nc, "default", "c3", workers=1, timeout_s=10)
        await colo.start()
        rel = await colo.release(1, version=1)
        assert (rel.acked, rel.failed) == (1, ["reserved-0"])
    finally:
        await nc.close()


async def test_an_ack_in_another_workers_name_is_refused_and_counted(nats_server, caplog):
    """With the job's colocation key the trainer counts an ack only when its MAC is the named worker's: reserved-1
    acking as reserved-0 (with its own key, or none) is refused, counted and logged once; reserved-0's own counts."""
    key = b"the-jobs-colocation-key"
    own = {w: worker_ack_key(key, "c5", w) for w in ("reserved-0", "reserved-1")}
    nc = await nats.connect(nats_server.url)
    try:
        colo = Colocation(nc, "default", "c5", workers=1, timeout_s=1.5, verifier=AckVerifier(key, "c5"))
        await colo.start()
        await fake_workers(nc, "c5", ["reserved-0"], keys={"reserved-0": own["reserved-1"]})  # the forger
        await fake_workers(nc, "c5", ["reserved-2"])  # a worker the manager gave no key
        invalid, missing = refused("mac_invalid"), refused("mac_missing")
        rel = await colo.release(0, version=0)
        assert rel.acked == 0, "an ack in another worker's name ended the wait"
        assert refused("mac_invalid") >= invalid + 1 and refused("mac_missing") >= missing + 1
        logged = [r for r in caplog.records if r.getMessage().startswith("colocation ack refused")]
        assert sorted(r.reason for r in logged) == ["mac_invalid", "mac_missing"], "each refusal is logged once"

        colo.timeout_s = 10
        await fake_workers(nc, "c5", ["reserved-0"], keys=own)  # the real reserved-0
        rel = await colo.release(1, version=1)
        assert (rel.acked, rel.failed) == (1, [])
    finally:
        await nc.close()


@pytest.mark.slow
async def test_trainer_releases_before_training_and_resumes_after_publishing(tmp_path, tiny_model_dir, nats_server):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "model").symlink_to(tiny_model_dir)
    spec = tiny_spec()
    spec.trainer.colocate_reserved = True
    spec.rollout.reserved.replicas = 1
    config = job_dir / "job.yaml"
    config.write_text(dump_job_spec(spec))
    tok = load_tokenizer(tiny_model_dir)
    stand_in = StandInManager(tok, stop_token_ids(tok)[0])
    server, target = await start_manager(stand_in)
    nc = await nats.connect(nats_server.url)
    timeline: list[tuple] = []  # every command, announcement and rollout request, in arrival order

    async def on_command(msg) -> None:
        cmd = ColocationCommand.model_validate_json(msg.data)
        timeline.append((cmd.action, cmd.step, len(stand_in.requests)))
        ack = ColocationAck(step=cmd.step, action=cmd.action, worker_id="reserved-0", released=True)
        await nc.publish(COLOCATION_ACKS.subject("default", "co"), ack.model_dump_json().encode())

    async def on_weights(msg) -> None:
        timeline.append(("weights", WeightsAnnounced.model_validate_json(msg.data).version))

    steps: list[StepReport] = []

    async def on_step(msg) -> None:
        steps.append(StepReport.model_validate_json(msg.data))

    for topic, cb in ((COLOCATION, on_command), (WEIGHTS, on_weights), (STEPS, on_step)):
        await nc.subscribe(topic.subject("default", "co"), cb=cb)
    await nc.flush()
    try:
        with WeightServerProcess(tmp_path / "ws", nats_server.url, job="co") as ws:
            cmd = [
                "-m",
                "trainer",
                "--config",
                str(config),
                "--manager",
                target,
                "--weight-server",
                ws.url,
                "--token-file",
                str(ws.token_file),
                "--model-dir",
                str(job_dir / "model"),
                "--run-dir",
                str(tmp_path / "run"),
                "--nats-url",
                nats_server.url,
                "--job",
                "co",
                "--steps",
                "2",
                "--connect-timeout",
                "20",
                "--colocation-timeout",
                "30",
            ]
            proc = await asyncio.create_subprocess_exec(
                __import__("sys").executable, *cmd, stderr=asyncio.subprocess.PIPE, env=child_env()
            )
            code, err = await wait_process(proc, 240)
            assert code == 0, err[-3000:]
        await nc.flush()
    finally:
        await nc.close()
        await server.stop(None)
    # (action, step, rollout requests made so far): release after step s's rollout, resume after v s+1 is out.
    assert timeline == [
        ("weights", 0),
        ("release", 0, 1),
        ("weights", 1),
        ("resume", 0, 1),
        ("release", 1, 2),
        ("weights", 2),
        ("resume", 1, 2),
    ]
    assert [(s.step, s.colocation_released, s.colocation_resumed) for s in steps] == [(0, 1, 1), (1, 1, 1)]
    assert all(0 <= s.colocation_wait_seconds < 30 for s in steps)
    assert "colocated with the reserved rollout workers" in err
