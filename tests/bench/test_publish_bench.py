"""bench/publish_bench.py for real on a few versions (the real publisher, a real weight-server process, the default
job's model): a dense update publishes snapshots with no delta encoded and no version listing after the start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dense_updates_encode_no_delta_and_list_versions_once(tmp_path: Path) -> None:
    out = tmp_path / "publish.json"
    cmd = [sys.executable, str(ROOT / "bench" / "publish_bench.py"), "--steps", "4", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["kinds"] == {"full": 4, "delta": 0}
    assert (got["encode_calls"], got["count_calls"], got["listing_calls"]) == (0, 3, 1)
    assert got["publish_ms_median"] > 0 and got["publish_cpu_ms_median"] > 0
