"""A stand-in for every rlboost service, for testing `rlboost local`'s orchestration without the real ones.

Run as `python fake_service.py -m <module> <flags>` (what the local plan passes after the interpreter).
Listens where the real service would (health on --metrics-port / --port), writes its pid under
$FAKE_PID_DIR, and behaves per $FAKE_TRAINER: 'ok' publishes two steps and `done` on NATS ('slow': after $FAKE_DELAY s),
'fail' exits 5, 'hang' waits forever. The fake manager answers GetStatus over real gRPC.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

_KEEP: list[object] = []


def serve_health(port: int) -> None:
    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), H)
    Thread(target=server.serve_forever, daemon=True).start()


def serve_manager(port: int) -> object:
    import grpc

    from rlboost.rollout.v1 import rollout_pb2 as pb
    from rlboost.rollout.v1 import rollout_pb2_grpc

    class Manager(rollout_pb2_grpc.RolloutManagerServicer):
        def GetStatus(self, request, context):  # noqa: N802
            workers = [
                pb.WorkerStatus(worker_id="reserved-0", pool=pb.POOL_RESERVED, weight_version=2, tokens_generated=40),
                pb.WorkerStatus(
                    worker_id="spot-0",
                    pool=pb.POOL_SPOT,
                    weight_version=2,
                    tokens_generated=60,
                    running=1,
                    inflight_tokens=5,
                ),  # always mid-response: a chaos target
            ]
            return pb.StatusReply(
                workers=workers,
                migrations=1,
                tokens_received=200,
                tokens_lost=3,
                tokens_regenerated=2,
                migrations_by_reason={"drained": 1, "rebalance": 0},
            )

    server = grpc.server(futures.ThreadPoolExecutor(2))
    rollout_pb2_grpc.add_RolloutManagerServicer_to_server(Manager(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


async def publish_steps(args: argparse.Namespace) -> None:
    import nats

    from rlboost.auth.nats import connect_options
    from rlboost.wire.events import DONE, STEPS, JobDone, StepReport

    nc = await nats.connect(args.nats_url, **connect_options(args.credentials_dir or "", "trainer"))
    for step in (1, 2):
        rep = StepReport(
            step=step,
            reward_mean=0.25 * step,
            tokens=100,
            rollout_seconds=0.5,
            train_seconds=0.2,
            sync_seconds=0.1,
            weight_version=step,
            weights_checksum=f"c{step}",
        )
        await nc.publish(STEPS.subject(args.namespace, args.job), rep.model_dump_json().encode())
    done = JobDone(ok=True, steps=2, final_weights_checksum="c2")
    await nc.publish(DONE.subject(args.namespace, args.job), done.model_dump_json().encode())
    await nc.flush()
    await nc.close()


def main() -> None:
    module = sys.argv[2]
    p = argparse.ArgumentParser()
    for flag in ("--port", "--metrics-port"):
        p.add_argument(flag, type=int)
    for flag in ("--nats-url", "--namespace", "--job", "--credentials-dir"):
        p.add_argument(flag)
    args, _ = p.parse_known_args(sys.argv[3:])
    with open(os.path.join(os.environ["FAKE_PID_DIR"], f"{module}-{os.getpid()}"), "w"):
        pass
    _KEEP.append(serve_manager(args.port) if module == "rollout_manager" else None)  # GC would stop the server
    health = args.metrics_port or args.port
    serve_health(health)
    if module == "trainer":
        mode = os.environ.get("FAKE_TRAINER", "ok")
        if mode == "fail":
            print("trainer: CUDA out of memory (pretend)", flush=True)
            time.sleep(0.5)  # stand-in behaviour: fail shortly after becoming ready
            sys.exit(5)
        if mode in ("ok", "slow"):
            if mode == "slow":
                time.sleep(float(os.environ.get("FAKE_DELAY", "2")))  # leaves time for chaos kills
            asyncio.run(publish_steps(args))
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
