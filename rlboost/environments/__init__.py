"""Environments for agentic episodes: the interface a plain Python environment implements, tool calling, the
built-in environments, and the sandbox every environment runs in.

    class MyEnv:                                   # registered: [project.entry-points."rlboost.environments"]
        def __init__(self, **args): ...            #   my_env = "my_pkg.envs:MyEnv"
        def reset(self, task: Example) -> list[dict]:        # the episode's first messages (its prompt)
        def step(self, action: str) -> Step:                 # the model's turn in; observation, reward, done out

`ToolEnvironment` (rlboost.environments.tools) does the tool-calling part: Python functions as tools, the model's
calls parsed from its text (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), a malformed call answered
with an observation naming the error. Environments run in env-runner processes, each episode in a confined
process (rlboost.environments.sandbox). Torch-free.
"""

from rlboost.environments.base import Environment, Message, Step

__all__ = ["Environment", "Message", "Step"]
