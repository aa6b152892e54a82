"""The newest published weights, as rank 0 knows them: their version and checksum, and the rule for the version of
the starting weights.

Versions on resume (the weight-server only accepts versions newer than its latest): the starting weights (the
model's, or a checkpoint's) are checksummed; if the weight-server's latest version holds exactly them it is reused,
otherwise they are published as max(latest + 1, checkpointed version) and the run continues from there. So a
resumed run whose killed predecessor already published later versions skips their numbers, with the same content
as an uninterrupted run (versions need not equal steps). Each step then publishes the next version.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from trainer import metrics
from trainer.publisher import Published, WeightPublisher, upload_model_assets, with_retries


class WeightVersions:
    """The version and checksum of the newest published weights (a checkpoint's, until the start is published)."""

    def __init__(self) -> None:
        self.version = 0
        self.checksum = ""  # '' until published, or the checkpoint's record of its weights

    def resume_at(self, version: int, checksum: str) -> None:
        """A checkpoint's weights: the version they were published as, and their checksum (checked on publish)."""
        self.version, self.checksum = version, checksum

    async def publish_start(self, publisher: WeightPublisher, state: dict[str, Any], model_dir: Path) -> None:
        """Publish the starting weights (and first the model's assets) at a version the weight-server accepts;
        CheckpointError when a checkpoint's weights were not restored exactly."""
        from rlboost.weights.checksum import state_checksum
        from rlboost.weights.safetensors_io import to_publish_dtype

        bf16 = await asyncio.to_thread(to_publish_dtype, state)
        ours = await asyncio.to_thread(state_checksum, bf16)
        if self.checksum and ours != self.checksum:
            raise await asyncio.to_thread(checksum_mismatch, bf16, ours, self.checksum)
        await upload_model_assets(publisher.client, model_dir, publisher.signer)  # before any version
        held = await publisher.held_versions()
        version = self.version
        if held:
            latest = max(held)
            same = (await with_retries("manifest", lambda: publisher.client.manifest(latest))).checksum == ours
            version = latest if same else max(latest + 1, self.version)
        published = await publisher.publish(version, state, skip_if_present=True)
        self.checksum, self.version = published.checksum, published.version
        metrics.WEIGHT_VERSION.set(self.version)

    @property
    def next_version(self) -> int:
        """The version a step's weights are published as."""
        return self.version + 1

    async def publish_next(self, publisher: WeightPublisher, state: dict[str, Any]) -> Published:
        """Publish a step's weights as the next version."""
        published = await publisher.publish(self.next_version, state, skip_if_present=True)
        self.version, self.checksum = published.version, published.checksum
        return published


def checksum_mismatch(bf16: dict[str, Any], ours: str, recorded: str) -> Exception:
    """The resume error when the restored weights' checksum is not the checkpoint's: it says whether the
    checkpoint was written by an older rlboost (checksum of the former definition, which these weights match)."""
    from rlboost.weights.checksum import legacy_state_checksum
    from trainer.checkpoint import CheckpointError

    head = f"restored weights have checksum {ours[:16]}, the checkpoint recorded {recorded[:16]}"
    if legacy_state_checksum(bf16) == recorded:
        return CheckpointError(
            f"{head}: the checkpoint was written by an older rlboost, whose weights checksum had another definition "
            "(sha256 of every byte; now sha256 over per-tensor xxh3-64 digests, see rlboost.weights.checksum). "
            "Start fresh (without --resume, or with an empty --checkpoint-dir) or resume it with the rlboost version that wrote it"
        )
    return CheckpointError(
        f"{head}: the weights were not restored exactly, or the checkpoint comes from another rlboost version whose "
        "weights checksum had another definition. Start fresh (without --resume, or with an empty --checkpoint-dir) "
        "or resume it with the rlboost version that wrote it"
    )
