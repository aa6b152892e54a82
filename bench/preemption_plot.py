"""The PNG of bench/preemption_bench.py: distributions per kind (resume seconds, stall seconds, tokens lost, new
workers' time to their first request) and the timeline of one preemption (notice, drain, each moved request's
stall until its next token on another worker). matplotlib, imported lazily (the Agg backend: no display)."""

from __future__ import annotations

from pathlib import Path

COLORS = {"notice": "tab:blue", "silent": "tab:red"}


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = [
        ("resume_s: hand-back → next token (s)", lambda r: [s for p in r["preemptions"] for s in p["resume_s"]]),
        (
            "stalled_s: last token kept → next token (s)",
            lambda r: [s for p in r["preemptions"] for s in p["stalled_s"]],
        ),
        ("tokens lost (= regenerated) per preemption", lambda r: [p["tokens_lost"] for p in r["preemptions"]]),
        ("tokens kept per preemption", lambda r: [p["tokens_kept"] for p in r["preemptions"]]),
        (
            "new spot worker: process start → first request (s)",
            lambda r: [w["first_token_s"] for w in r["new_workers"] if w["replacement"] and "first_token_s" in w],
        ),
    ]
    for ax, (title, values) in zip(axes.flat, panels, strict=False):
        series = [(run["kind"], values(run)) for run in runs]
        bins = _bins([x for _, xs in series for x in xs])
        for kind, xs in series:
            if xs:
                ax.hist(xs, bins=bins, alpha=0.6, color=COLORS.get(kind), label=f"{kind} (n={len(xs)})")
        ax.set_title(title, fontsize=10)
        if any(xs for _, xs in series):
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
    """One preemption (the first notice one, else the first), its moved requests as bars from their last token kept
    to their next token; t = 0 at the notice (or at the hand-back of a silent one)."""
    chosen = [p for r in runs for p in r["preemptions"] if p["resumed_at"]]
    chosen.sort(key=lambda p: p["kind"] != "notice")
    if not chosen:
        ax.set_title("no moved request resumed", fontsize=10)
        return
    p = chosen[0]
    t0 = p["notice_at"] or p["drained_at"]
    for i, (end, stalled) in enumerate(zip(p["resumed_at"], p["stalled_s"], strict=True)):
        ax.barh(i, stalled, left=end - stalled - t0, color=COLORS.get(p["kind"]), alpha=0.7)
    if p["notice_at"]:
        ax.axvline(0, color="black", linestyle="--", label="notice")
    ax.axvline(p["drained_at"] - t0, color="green", linestyle=":", label="drained / handed back")
    ax.set_xlabel("seconds")
    ax.set_ylabel("moved request")
    ax.set_title(
        f"one {p['kind']} preemption of {p['worker_id']}: requests stalled until their next token", fontsize=10
    )
    ax.legend(fontsize=8)
