"""A multi-turn verifiers environment: the environment plays the user. It asks the task's question, then asks the
model to confirm; the reward is 1.0 when the model's last answer is the sum."""

import verifiers.v1 as vf
from rlb_vf_single import SumTaskset


class ConfirmConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class ConfirmEnv(vf.Env[ConfirmConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as chat:
            await chat.turn()  # the task's question: the model answers
            await chat.turn("Are you sure? Give the number again.")


class ConfirmTaskset(SumTaskset):
    pass


__all__ = ["ConfirmEnv", "ConfirmTaskset"]
