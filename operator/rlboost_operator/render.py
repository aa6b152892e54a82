"""The children of an RLJob exactly as the operator creates them: built by children.build_children and owned by the
RLJob (kopf.adopt: an ownerReference, its namespace, its labels), a retained PVC left unowned. lifecycle.apply_children
applies them; `rlboost render` (offline.py) prints them, so the two cannot drift."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlboost_operator import children


def owned(built: list[dict[str, Any]], owner: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`built` (in place, and returned) with every child the RLJob `owner` owns adopted by it."""
    import kopf

    for child in built:
        if children.adopted(child):
            kopf.adopt(child, owner=owner)  # type: ignore[arg-type]  # a Body or a plain RLJob mapping
    return built
