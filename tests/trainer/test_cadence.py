"""When a step writes a checkpoint (trainer.resume.Checkpoints.save_due) and exports the policy
(trainer.export.PolicyExport.due, .dest), and the version each step's weights get (trainer.versions): pure."""

from __future__ import annotations

from pathlib import Path

from rlboost.spec import ExportSpec
from tests.trainer.conftest import tiny_spec
from trainer.export import PolicyExport
from trainer.publisher import Published
from trainer.resume import Checkpoints
from trainer.versions import WeightVersions


def test_checkpoints_every_k_steps_at_the_last_step_and_where_the_data_ends(tmp_path: Path) -> None:
    spec = tiny_spec()
    spec.trainer.checkpoint_every = 2
    ckpts = Checkpoints(spec, tmp_path, resume=False, steps=5)
    due = [step for step in range(5) if ckpts.save_due(step, data_ends=False)]
    assert due == [1, 3, 4]  # after 2 and 4 steps, and the run's last
    assert ckpts.save_due(0, data_ends=True)  # the data's last step
    assert not any(Checkpoints(spec, None, False, 5).save_due(step, True) for step in range(5))  # no directory


def test_exports_at_the_end_and_every_n_checkpoints_beside_the_final_path(tmp_path: Path) -> None:
    spec = tiny_spec()
    spec.trainer.checkpoint_every = 2
    assert not any(PolicyExport(spec, 6, tmp_path, tmp_path, None).due(n) for n in range(1, 7))  # type: ignore[arg-type]
    spec.export = ExportSpec(path=str(tmp_path / "policy"), every_checkpoints=2)
    export = PolicyExport(spec, 6, tmp_path, tmp_path, None)  # type: ignore[arg-type]
    assert [n for n in range(1, 7) if export.due(n)] == [4, 6]
    assert export.dest(6) == str(tmp_path / "policy") and export.dest(4) == str(tmp_path / "policy-step-00000004")


class _Publisher:
    def __init__(self) -> None:
        self.asked: list[int] = []

    async def publish(self, version: int, state: dict, skip_if_present: bool = False) -> Published:
        self.asked.append(version)
        return Published(version, f"sum{version}", "delta", 10, 0.0, skip_if_present)


async def test_each_step_publishes_the_next_version_and_remembers_it() -> None:
    versions, publisher = WeightVersions(), _Publisher()
    versions.resume_at(7, "sum7")  # a checkpoint's (or the starting weights')
    assert versions.next_version == 8
    published = await versions.publish_next(publisher, {})  # type: ignore[arg-type]
    assert published.version == 8 and (versions.version, versions.checksum) == (8, "sum8")
    await versions.publish_next(publisher, {})  # type: ignore[arg-type]
    assert publisher.asked == [8, 9]
