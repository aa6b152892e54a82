"""A tool-using verifiers taskset: 'What is a*b?' with a calculator tool (an MCP toolset); reward 1.0 for the product."""

import verifiers.v1 as vf
from rlb_vf_calc_tool import CalcToolset
from rlb_vf_single import _last_reply


class ProductData(vf.TaskData):
    answer: str = ""


class ProductTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ProductTask(vf.Task[ProductData, vf.State, ProductTaskConfig]):
    @classmethod
    def toolsets(cls, config: ProductTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(_last_reply(trace) == self.data.answer)


class ProductConfig(vf.TasksetConfig):
    task: ProductTaskConfig = ProductTaskConfig()


class ProductTaskset(vf.Taskset[ProductTask, ProductConfig]):
    def load(self) -> list[ProductTask]:
        rows = [ProductData(prompt=f"What is {a}*{b}?", answer=str(a * b)) for a, b in [(7, 6), (12, 11)]]
        return [ProductTask(row, self.config.task) for row in rows]


__all__ = ["ProductTaskset"]
