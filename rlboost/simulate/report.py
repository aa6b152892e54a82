"""Compare policies: the JSON document, a rich table and a plot of throughput and spot count over time."""

from __future__ import annotations

from pathlib import Path

from rlboost.simulate.cluster import ClusterConfig, PolicyResult
from rlboost.simulate.runner import SAME_ALGORITHM_BASELINE


def comparison(cfg: ClusterConfig, results: dict[str, PolicyResult]) -> dict:
    """{"policies": {name: summary}, "relative_to_reserved_only": {name: {throughput, cost_efficiency}}}."""
    policies = {name: r.summary(cfg) for name, r in results.items()}
    base = policies.get("reserved-only")
    relative = {}
    if base and base["samples_per_s"] and base["cost_efficiency"]:
        relative = {
            name: {
                "throughput": s["samples_per_s"] / base["samples_per_s"],
                "cost_efficiency": s["cost_efficiency"] / base["cost_efficiency"],
            }
            for name, s in policies.items()
        }
    return {"policies": policies, "relative_to_reserved_only": relative, "spot_share": spot_share(policies)}


def spot_share(policies: dict[str, dict]) -> dict | None:
    """rlboost's throughput gain over reserved-only, split: the algorithm's (partial rollout on the reserved GPUs
    alone, `reserved-only+staleness`) and spot's (the rest). None unless all three policies ran."""
    names = ("reserved-only", SAME_ALGORITHM_BASELINE, "rlboost")
    if not all(n in policies and policies[n]["samples_per_s"] for n in names):
        return None
    base, same_algorithm, ours = (policies[n]["samples_per_s"] for n in names)
    gain = ours - base
    return {
        "rlboost_vs_reserved_only": ours / base,
        "same_algorithm_reserved_only_vs_reserved_only": same_algorithm / base,
        "rlboost_vs_same_algorithm_reserved_only": ours / same_algorithm,
        "cost_efficiency_vs_same_algorithm_reserved_only": policies["rlboost"]["cost_efficiency"]
        / policies[SAME_ALGORITHM_BASELINE]["cost_efficiency"],
        # of rlboost's extra samples/s over reserved-only, the fraction spot brings (<= 0: spot added nothing)
        "spot_share_of_gain": (ours - same_algorithm) / gain if gain > 0 else 0.0,
    }


def print_table(doc: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("policy", "samples/s", "x reserved", "$/h", "samples/$", "x reserved", "GPU util", "bubble"):
        table.add_column(col, justify="right")
    rel = doc["relative_to_reserved_only"]
    for name, s in doc["policies"].items():
        r = rel.get(name, {})
        table.add_row(
            name,
            f"{s['samples_per_s']:.2f}",
            f"{r.get('throughput', 0):.2f}x",
            f"{s['cost_per_hour']:.1f}",
            f"{s['cost_efficiency']:.1f}",
            f"{r.get('cost_efficiency', 0):.2f}x",
            f"{s['gpu_utilisation']:.0%}",
            f"{s['bubble_fraction']:.0%}",
        )
    console = Console()
    console.print(table)
    if share := doc.get("spot_share"):
        console.print(
            f"rlboost {share['rlboost_vs_reserved_only']:.2f}x reserved-only: partial rollout alone gives "
            f"{share['same_algorithm_reserved_only_vs_reserved_only']:.2f}x ({SAME_ALGORITHM_BASELINE}), spot "
            f"{share['rlboost_vs_same_algorithm_reserved_only']:.2f}x on top; spot's share of the gain "
            f"{share['spot_share_of_gain']:.0%}"
        )
    for name, s in doc["policies"].items():  # the weight-distribution model's figures (rlboost.simulate.weights)
        console.print(
            f"{name}: cold starts {s['cold_start_gpu_hours']:.1f} GPU-h, "
            f"weight-server egress {s['server_egress_bytes_per_version'] / 1e9:.1f} GB per version"
        )


def plot(results: dict[str, PolicyResult], path: str | Path, title: str) -> Path:
    """Throughput per step and spot instances in use, over simulated hours, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tp, ax_spot) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=[2, 1])
    for name, r in results.items():
        hours = [s.end / 3600 for s in r.steps]
        ax_tp.plot(hours, [s.samples / (s.end - s.start) for s in r.steps], label=name, lw=1.2)
        ax_spot.step(hours, [s.spot_instances for s in r.steps], where="post", label=name, lw=1.0)
    ax_tp.set_ylabel("samples / s")
    ax_tp.set_title(title)
    ax_tp.legend()
    ax_tp.grid(alpha=0.3)
    ax_spot.set_ylabel("spot instances used")
    ax_spot.set_xlabel("simulated hours")
    ax_spot.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
