"""`rlboost simulate`: throughput and cost of reserved-only, disaggregated, the paper's hybrid and rlboost on a spot trace."""

from __future__ import annotations

import argparse
import json
import sys

from rlboost.simulate.runner import ALL_POLICIES, POLICIES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="replay a spot trace at cluster scale and compare policies")
    p.add_argument("--trace", required=True, help="spot trace, 'seconds,instances' per line (Bamboo format)")
    p.add_argument("--model", default="qwen3-8b", help="qwen3-1.7b, qwen3-8b or qwen3-14b")
    p.add_argument("--reserved-gpus", type=int, default=8, help="reserved H100s (training + colocated rollout)")
    p.add_argument("--reserved-price", type=float, default=10.47, help="USD per reserved GPU-hour")
    p.add_argument("--spot-price", type=float, default=2.66, help="USD per spot GPU-hour")
    p.add_argument("--gpus-per-spot", type=int, default=2, help="GPUs per spot instance in the trace")
    p.add_argument("--steps", type=int, default=100, help="RL steps to simulate (the trace repeats if needed)")
    p.add_argument(
        "--policies", default=",".join(POLICIES), help="comma-separated subset of " + ", ".join(ALL_POLICIES)
    )
    p.add_argument("--weight-sync", choices=("delta", "full"), default="delta", help="spot weight pulls per step")
    p.add_argument(
        "--weights-fanout",
        choices=("on", "off", "legacy"),
        default="on",
        help="weight distribution: relays (peer fan-out, the product's default), off (all from the weight-server), "
        "legacy (each VM at its own link rate, unshared server: the figures before the weight model)",
    )
    p.add_argument("--weight-server-gbit", type=float, default=100.0, help="the weight-server's egress link, Gbit/s")
    p.add_argument("--regions", type=int, default=1, help="regions the spot VMs spread over (the server is in one)")
    p.add_argument(
        "--peak-instances",
        type=int,
        default=0,
        help="scale the trace's counts so its peak is this many spot VMs (0: as traced)",
    )
    p.add_argument("--prompts-per-step", type=int, default=256, help="prompts per RL step (x 8 samples each)")
    p.add_argument("--seed", type=int, default=0, help="seed of the response lengths")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--plot", default="", help="write throughput and spot count over time to this PNG")
    p.set_defaults(func=run)


def _fail(msg: str) -> int:
    print(f"rlboost simulate: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from rlboost.simulate.cluster import ClusterConfig
    from rlboost.simulate.hardware import MODELS
    from rlboost.simulate.report import comparison, plot, print_table
    from rlboost.simulate.runner import SimulationStalledError, run_policy
    from rlboost.simulate.trace import TraceError, load_trace
    from rlboost.simulate.weights import WeightNetwork
    from rlboost.simulate.workload import Workload

    if args.model not in MODELS:
        return _fail(f"--model: unknown {args.model!r}; choose one of {', '.join(MODELS)}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if bad := [p for p in policies if p not in ALL_POLICIES]:
        return _fail(f"--policies: unknown {', '.join(bad)}; choose from {', '.join(ALL_POLICIES)}")
    if min(args.steps, args.reserved_gpus, args.gpus_per_spot, args.regions, args.prompts_per_step) < 1:
        return _fail("--steps, --reserved-gpus, --gpus-per-spot, --regions and --prompts-per-step must be >= 1")
    if args.weight_server_gbit <= 0:
        return _fail("--weight-server-gbit must be > 0 (the weight-server's egress link, e.g. 100)")
    if args.peak_instances < 0:
        return _fail("--peak-instances must be >= 0 (0: the trace's own counts)")
    try:
        trace = load_trace(args.trace)
    except TraceError as err:
        return _fail(str(err))
    if args.peak_instances and max(trace.counts):
        trace = trace.scaled(args.peak_instances / max(trace.counts))
    cfg = ClusterConfig(
        MODELS[args.model],
        Workload(prompts_per_step=args.prompts_per_step),
        weights=None
        if args.weights_fanout == "legacy"
        else WeightNetwork(server_link_bytes_s=args.weight_server_gbit * 1e9 / 8, regions=args.regions),
        weights_fanout=args.weights_fanout == "on",
        reserved_gpus=args.reserved_gpus,
        gpus_per_spot=args.gpus_per_spot,
        reserved_price=args.reserved_price,
        spot_price=args.spot_price,
        weight_sync=args.weight_sync,
    )
    try:
        results = {p: run_policy(cfg, p, trace, args.steps, args.seed) for p in _progress(policies, args.json)}
    except SimulationStalledError as err:
        return _fail(str(err))
    doc = comparison(cfg, results)
    # say how the run differs from the traced market: its spot counts scaled, and how weights reach new VMs
    doc["weights"] = {"fanout": args.weights_fanout, "regions": args.regions, "server_gbit": args.weight_server_gbit}
    doc["trace_scaled_to_peak"] = args.peak_instances or None
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        scaled = f" scaled to a peak of {args.peak_instances} VMs" if args.peak_instances else ""
        title = f"{args.model}, {args.reserved_gpus} reserved GPUs, trace {args.trace}{scaled}"
        print_table(doc, f"{title}, weight fan-out {args.weights_fanout}, {args.regions} region(s)")
    if args.plot:
        plot(results, args.plot, f"{args.model} on {args.trace.rsplit('/', 1)[-1]}")
    return 0


def _progress(policies: list[str], quiet: bool):
    if quiet:
        yield from policies
        return
    from rich.progress import track

    yield from track(policies, description="simulating policies")
