"""Issue 17's measurement: `rlboost simulate` on every Bamboo trace, every policy alone and all together.

Writes a JSON document (per trace: each policy's summary and its ratios to reserved-only) and the frontier
plot (cost efficiency against throughput, both relative to reserved-only, one point per trace and policy).
Runs the traces in parallel processes; the simulation itself is deterministic for a seed.

    python scripts/simulate_frontier.py --out docs/simulation-frontier.json --plot docs/simulation-frontier.png
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rlboost.simulate.cluster import ClusterConfig
from rlboost.simulate.hardware import MODELS
from rlboost.simulate.report import comparison
from rlboost.simulate.runner import ALL_POLICIES, run_policy
from rlboost.simulate.trace import load_trace
from rlboost.simulate.workload import Workload

TRACES = Path(__file__).resolve().parents[1] / "traces" / "bamboo"


def one(job: tuple[str, str, int, int]) -> tuple[str, str, dict]:
    trace_path, policy, steps, seed = job
    cfg = ClusterConfig(MODELS["qwen3-8b"], Workload())
    result = run_policy(cfg, policy, load_trace(trace_path), steps, seed)
    return trace_path, policy, {"result": result, "cfg": cfg}


def sweep(steps: int, seed: int, workers: int) -> dict[str, dict]:
    traces = sorted(str(p) for p in TRACES.glob("*.csv"))
    jobs = [(t, p, steps, seed) for t in traces for p in ALL_POLICIES]
    by_trace: dict[str, dict] = {t: {} for t in traces}
    with ProcessPoolExecutor(workers) as pool:
        for trace, policy, out in pool.map(one, jobs):
            by_trace[trace][policy] = out
    return {
        Path(t).name: comparison(next(iter(r.values()))["cfg"], {p: o["result"] for p, o in r.items()})
        for t, r in by_trace.items()
    }


def plot(doc: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    markers = dict(zip(ALL_POLICIES, "osD^v<>p", strict=False))
    for i, (trace, d) in enumerate(doc.items()):
        colour = f"C{i}"
        for policy, rel in d["relative_to_reserved_only"].items():
            ax.scatter(rel["throughput"], rel["cost_efficiency"], c=colour, marker=markers[policy], s=45)
        ax.plot([], [], c=colour, label=trace.removeprefix("aws-spot-instances-")[:38])
    for policy, m in markers.items():
        ax.scatter([], [], c="grey", marker=m, label=policy)
    ax.axhline(1.5, ls="--", c="grey", lw=0.8)
    ax.axhline(1.28, ls=":", c="grey", lw=0.8)
    ax.axvline(2.0, ls="--", c="grey", lw=0.8)
    ax.set_xlabel("throughput vs reserved-only (x)")
    ax.set_ylabel("cost efficiency (samples per $) vs reserved-only (x)")
    ax.set_title("Qwen3-8B, 8 reserved H100, 100 steps: every Bamboo trace, every policy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="RL steps per run")
    ap.add_argument("--seed", type=int, default=0, help="seed of the response lengths")
    ap.add_argument("--workers", type=int, default=2, help="parallel processes")
    ap.add_argument("--out", type=Path, required=True, help="JSON document to write")
    ap.add_argument("--plot", type=Path, help="frontier PNG to write")
    args = ap.parse_args()
    doc = sweep(args.steps, args.seed, args.workers)
    args.out.write_text(json.dumps(doc, indent=1))
    if args.plot:
        plot(doc, args.plot)
    for trace, d in doc.items():
        rel = d["relative_to_reserved_only"]
        cells = "  ".join(f"{p} {r['throughput']:.2f}x/{r['cost_efficiency']:.2f}x" for p, r in rel.items())
        print(f"{trace[:50]}: {cells}")


if __name__ == "__main__":
    main()
