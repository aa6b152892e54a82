"""A real installable reward package for tests: `install(dir)` writes the module and its dist-info (with an
`rlboost.rewards` entry_points.txt) under `dir`, so putting `dir` on sys.path / PYTHONPATH registers it the way
`pip install` of a user package would.

`chaos` misbehaves as its response text says (hang, exit, segfault, hog memory, burn CPU, exec the text, open a
socket, start a process, return NaN or a string, catch a refusal, return the row's metadata 'score'); any
other text scores like exact_match.
`broken` fails to import.
"""

from __future__ import annotations

from pathlib import Path

MODULE = """
import os


def chaos(text, example):
    if text == "hang":
        import time
        while True:
            time.sleep(1)
    if text == "exit":
        os._exit(7)
    if text == "segfault":
        import ctypes
        ctypes.string_at(0)
    if text == "hog":
        return float(len(bytearray(2 << 30)))
    if text == "burn":
        while True:
            pass
    if text.startswith("import os"):
        import cProfile
        cProfile.run(text)  # what task.reward 'cProfile:run' did with model output
        return 1.0
    if text == "socket":
        import socket
        socket.create_connection(("127.0.0.1", int(example.question)), timeout=1)
        return 1.0
    if text == "process":
        import subprocess
        subprocess.run(["true"], check=True)
        return 1.0
    if text == "caught":
        try:
            eval("1 + 1")
        except Exception:
            pass
        return 1.0
    if text == "nan":
        return float("nan")
    if text == "string":
        return "1"
    if text == "raise":
        raise ValueError("bad sample")
    if text == "metadata":
        return float(example.metadata["score"])
    return 1.0 if text.strip() == example.answer else 0.0
"""


def install(root: Path) -> Path:
    """Write the package under `root` and return `root` (put it on sys.path and PYTHONPATH)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "chaos_rewards.py").write_text(MODULE)
    (root / "broken_rewards.py").write_text("raise ImportError('this reward package is broken')\n")
    info = root / "chaos_rewards-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: chaos-rewards\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[rlboost.rewards]\nchaos = chaos_rewards:chaos\nbroken = broken_rewards:score\n"
        "exact_match = chaos_rewards:chaos\n"
    )
    return root
