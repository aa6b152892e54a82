"""Test helpers: wait on a condition with a deadline (never a bare sleep)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll `predicate` until truthy (returns its value) or fail after `timeout` seconds. No bare sleeps in tests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def wait_until_async(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
):
    """`wait_until` for a test on an event loop: polls without blocking the loop the awaited work runs on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(interval)  # the polling interval of a condition with a deadline
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
