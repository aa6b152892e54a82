"""A package of environments made for a test: a module and its dist-info (entry points under
`rlboost.environments`) in a directory that the test puts on the path of this process and of the processes it starts,
as `pip install` would put a real one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def install(site: Path, module: str, source: str, entries: dict[str, str]) -> Path:
    """`module`.py with `source`, and its entry points `name -> attribute of module`."""
    dist = site / f"{module}-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {module}:{attr}\n" for name, attr in entries.items())
    (dist / "entry_points.txt").write_text(f"[rlboost.environments]\n{lines}")
    (site / f"{module}.py").write_text(source)
    return site


def on_path(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`site` importable here and in every process started from here."""
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
