"""The env-runner tests' tokenizer with the chat template."""

import pytest

from rlboost.environments.chat import ChatFormat
from tests.env_runner.scripted import make_fmt


@pytest.fixture(scope="module")
def fmt() -> ChatFormat:
    return make_fmt()
