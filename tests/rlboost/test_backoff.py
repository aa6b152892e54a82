"""keep_trying: retries only the named errors, returns the first success, gives up with the last error."""

import logging

import pytest

from rlboost.backoff import keep_trying

LOG = logging.getLogger("test")


def _failing(times: int, error: Exception):
    calls = []

    async def attempt() -> int:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return len(calls)

    return attempt, calls


async def test_a_step_that_fails_twice_then_succeeds_returns_its_result() -> None:
    attempt, calls = _failing(2, ConnectionError("down"))
    assert await keep_trying(attempt, ConnectionError, wait_s=10, log=LOG) == 3
    assert len(calls) == 3


async def test_no_wait_is_one_try_and_the_error_is_raised() -> None:
    attempt, calls = _failing(5, ConnectionError("down"))
    with pytest.raises(ConnectionError, match="down"):
        await keep_trying(attempt, ConnectionError, wait_s=0, log=LOG)
    assert len(calls) == 1


async def test_other_errors_are_not_retried() -> None:
    attempt, calls = _failing(5, ValueError("bad"))
    with pytest.raises(ValueError):
        await keep_trying(attempt, ConnectionError, wait_s=10, log=LOG)
    assert len(calls) == 1
