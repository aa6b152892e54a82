"""Keep trying a service's start-up step with back-off until a deadline.

NATS or a peer may come up after the service, or its Service name may not resolve yet (a new pod's DNS): the
weight-server and the rollout-manager wait for NATS this way (`--nats-wait`) instead of exiting at start-up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
FIRST_PAUSE_S, MAX_PAUSE_S = 0.5, 5.0


async def keep_trying(
    attempt: Callable[[], Awaitable[T]],
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    wait_s: float,
    log: logging.Logger,
    what: str = "NATS",
) -> T:
    """`attempt()`'s result; on `retry_on`, again after 0.5 s doubling to 5 s, until `wait_s` have passed, when the
    last error is raised (`wait_s` 0: one try)."""
    deadline, pause = time.monotonic() + wait_s, FIRST_PAUSE_S
    while True:
        try:
            return await attempt()
        except retry_on as err:
            if time.monotonic() + pause > deadline:
                raise
            log.warning(f"{what} not reachable yet; trying again", extra={"error": str(err), "in_s": pause})
        await asyncio.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE_S)
