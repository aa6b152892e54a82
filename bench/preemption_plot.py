"""The PNG of bench/preemption_bench.py: distributions per kind (resume seconds, stall seconds, tokens lost, new
workers' time to their first request) and the timeline of one preemption (notice, drain, each moved request's
stall until its next token on another worker). matplotlib, imported lazily (the Agg backend: no display)."""

from __future__ import annotations

from pathlib import Path

COLORS = {"notice": "tab:blue", "silent": "tab:red", "expired": "tab:orange"}


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    preempted = [p for r in runs for p in r["preemptions"] if p["requests"]]  # by the preemption's kind
    by_kind = {k: [p for p in preempted if p["kind"] == k] for k in COLORS}
    panels = [
        (
            "resume_s: hand-back → next token (s)",
            {k: [s for p in ps for s in p["resume_s"]] for k, ps in by_kind.items()},
        ),
        (
            "stalled_s: last token kept → next token (s)",
            {k: [s for p in ps for s in p["stalled_s"]] for k, ps in by_kind.items()},
        ),
        (
            "tokens lost (= regenerated) per preemption",
            {k: [p["tokens_lost"] for p in ps] for k, ps in by_kind.items()},
        ),
        ("tokens kept per preemption", {k: [p["tokens_kept"] for p in ps] for k, ps in by_kind.items()}),
        (
            "replacement spot worker: process start → first request (s), by run",
            {
                r["kind"]: [w["first_token_s"] for w in r["new_workers"] if w["replacement"] and "first_token_s" in w]
                for r in runs
            },
        ),
    ]
    for ax, (title, series) in zip(axes.flat, panels, strict=False):
        bins = _bins([x for xs in series.values() for x in xs])
        for kind, xs in series.items():
            if xs:
                ax.hist(xs, bins=bins, alpha=0.6, color=COLORS.get(kind), label=f"{kind} (n={len(xs)})")
        ax.set_title(title, fontsize=10)
        if any(series.values()):
            ax.legend(fontsize=8)
    _timeline(axes.flat[5], runs)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bins(xs: list[float]) -> list[float]:
    """Bins shared by every kind of a panel (a kind alone would get its own range: a single value is a sliver)."""
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    return [lo + (hi - lo) * i / 20 for i in range(21)]


def _timeline(ax, runs: list[dict]) -> None:
    """One notice and one silent preemption (the first of each whose requests resumed), each moved request a bar from
    its last token kept to its next token on another worker. t = 0 at the notice, or at the silent worker's last
    message (its death, as near as the manager can tell); the dotted line is the hand-back."""
    row = 0
    for kind in COLORS:
        p = next((p for r in runs for p in r["preemptions"] if p["kind"] == kind and p["resumed_at"]), None)
        if p is None:
            continue
        t0 = p["notice_at"] if kind == "notice" else p["drained_at"] - (p["detected_after_s"] or 0.0)
        for end, stalled in zip(p["resumed_at"], p["stalled_s"], strict=True):
            ax.barh(row, stalled, left=end - stalled - t0, color=COLORS[kind], alpha=0.7)
            row += 1
        ax.plot([p["drained_at"] - t0] * 2, [row - len(p["resumed_at"]) - 0.5, row - 0.5], "k:")
        ax.text(
            0, row - 0.5, f" {kind}: {p['worker_id']}, {p['tokens_kept']} kept, {p['tokens_lost']} lost", fontsize=8
        )
        row += 1
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("seconds from the notice / the worker's last message")
    ax.set_ylabel("moved request")
    ax.set_title("one preemption of each kind: each moved request's stall", fontsize=10)


def main(argv: list[str] | None = None) -> int:
    """Draw the PNG again from a `preemption_bench.py --json` file: `python bench/preemption_plot.py RESULT.json OUT.png`."""
    import argparse
    import json

    p = argparse.ArgumentParser(description="The preemption bench's plot, from its --json output.")
    p.add_argument("result", type=Path, help="what `bench/preemption_bench.py --json PATH` wrote")
    p.add_argument("png", type=Path, help="the PNG to write")
    args = p.parse_args(argv)
    try:
        runs = json.loads(args.result.read_text())["runs"]
    except (OSError, ValueError, KeyError) as err:
        p.error(f"{args.result}: not a preemption_bench.py --json result ({err})")
    plot(runs, args.png)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
