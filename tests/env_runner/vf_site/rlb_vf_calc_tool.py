"""The calculator tool of `rlb-vf-tools`, an MCP server verifiers starts for each rollout (`python -m` this module)."""

import verifiers.v1 as vf

from rlboost.environments.calculator import calculate


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression (numbers, + - * / and parentheses)."""
        return calculate(expression)


if __name__ == "__main__":
    CalcToolset.run()
