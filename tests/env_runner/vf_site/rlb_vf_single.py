"""A single-turn verifiers taskset: 'What is i+i?', reward 1.0 for the exact sum."""

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str = ""


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(_last_reply(trace) == self.data.answer)


def _last_reply(trace: vf.Trace) -> str:
    replies = [m for m in trace.messages if m.role == "assistant"]
    content = replies[-1].content if replies else ""
    return content.strip() if isinstance(content, str) else ""


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 4


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        rows = [SumData(prompt=f"What is {i}+{i}?", answer=str(2 * i)) for i in range(self.config.num_tasks)]
        return [SumTask(row, self.config.task) for row in rows]


__all__ = ["SumTaskset"]
