"""bench/catchup_bench.py on a small state (1M parameters, 1 and 5 versions behind): a real weight-server, a real peer
that kept the last 4 deltas, and a lagging worker's real pulls. Every catch-up is bit-exact; a peer serves what it
holds (all of a 1-version chain, 4 of a 5-version one); a compacted delta is fewer bytes than the chain and comes
from the server (no peer holds one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_catch_up_from_peers_and_server(tmp_path: Path) -> None:
    out = tmp_path / "catchup.json"
    cmd = [sys.executable, ROOT / "bench" / "catchup_bench.py", "--params", "1e6", "--lags", "1,5", "--json", out]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    figures = json.loads(out.read_text())
    rows = {(r["k"], r["source"], r["plan"]): r for r in figures["rows"]}
    assert len(rows) == 8 and all(r["bit_exact"] for r in rows.values())
    delta = figures["delta_bytes"]
    assert rows[1, "peers", "chain"]["peer_bytes"] == rows[1, "peers", "chain"]["bytes"] == delta[-1]
    assert rows[5, "peers", "chain"]["peer_bytes"] == sum(delta[-4:])  # the peer keeps the last 4
    assert rows[5, "server", "chain"]["peer_bytes"] == 0 and rows[5, "server", "chain"]["bytes"] == sum(delta[-5:])
    assert rows[5, "server", "compacted"]["paths"].keys() == {"compacted"}
    assert rows[5, "server", "compacted"]["bytes"] < rows[5, "server", "chain"]["bytes"]


def test_bad_lags_is_one_line() -> None:
    cmd = [sys.executable, ROOT / "bench" / "catchup_bench.py", "--lags", "0,21"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--lags [0, 21]: each between 1 and 20" in res.stderr
