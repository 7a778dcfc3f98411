"""`scene-eplb compare A B`: deltas between two bench results (refuses different N/C/r);
`scene-eplb compare --factorial ARM=R1.json,R2.json,... x4`: the factorial A/B over saved results;
`scene-eplb compare --factorial-plan ROUNDS`: the seeded random order to run its arms in."""

from __future__ import annotations

import json
from pathlib import Path

from ..ab import factorial
from ..ab.compare import chart_png, compare, markdown
from ..ab.results import METRICS, read_result
from ..errors import SceneEplbError
from ..fileio import atomic_write_files
from .console import Console, json_safe
from .options import check_output_dir, integer

HELP = "deltas between two bench results (refuses different N/C/r), or the factorial A/B of four arms"


def add_arguments(p) -> None:
    p.add_argument("a", nargs="?", help="reference result (e.g. linear layout)")
    p.add_argument("b", nargs="?", help="result to compare (e.g. fitted layout)")
    p.add_argument("--name-a", default="A")
    p.add_argument("--name-b", default="B")
    p.add_argument(
        "--factorial",
        nargs="+",
        metavar="ARM=R1.json,R2.json",
        help=f"the factorial A/B instead of A vs B: each of the arms {', '.join(factorial.ARMS)} with its results, "
        "one per round in round order, each its own server start",
    )
    p.add_argument(
        "--metric",
        choices=METRICS,
        default="prefill_throughput_per_card",
        help="the factorial's primary metric (default prefill_throughput_per_card; output_throughput_per_card on a D node)",
    )
    p.add_argument(
        "--factorial-plan",
        type=integer(1, 1000),
        metavar="ROUNDS",
        help="print the order to run the four arms in, per round (seeded random), and exit",
    )
    p.add_argument("--seed", type=integer(0, 2**32 - 1), default=0, help="seed of --factorial-plan (default 0)")
    p.add_argument("-o", "--output", help="directory for compare.md/.json/.png (factorial.md/.json/.png with --factorial)")


def parse_arms(specs: list[str]) -> dict[str, list[str]]:
    """``ARM=F1,F2`` specs as arm -> files, each of the four arms exactly once."""
    arms: dict[str, list[str]] = {}
    for spec in specs:
        arm, sep, files = spec.partition("=")
        if not sep or arm not in factorial.ARMS or not files:
            raise SceneEplbError(
                f"--factorial {spec!r}: expected ARM=R1.json,R2.json with ARM one of {', '.join(factorial.ARMS)}"
            )
        if arm in arms:
            raise SceneEplbError(f"--factorial: arm {arm} given twice")
        arms[arm] = [f for f in files.split(",") if f]
    missing = [a for a in factorial.ARMS if a not in arms]
    if missing:
        raise SceneEplbError(f"--factorial: no results for arm(s) {', '.join(missing)}")
    return arms


def _plan(args, console: Console) -> None:
    orders = factorial.round_orders(args.factorial_plan, args.seed)
    text = "\n".join(f"round {i + 1}: {' '.join(o)}" for i, o in enumerate(orders))
    console.emit({"seed": args.seed, "order": orders}, text)


def _factorial(args, console: Console) -> None:
    files = parse_arms(args.factorial)
    results = {arm: [read_result(f) for f in paths] for arm, paths in files.items()}
    summary = {**factorial.analyse(results, args.metric), "files": files}
    text = factorial.markdown(summary) + f"\n{args.metric}: {factorial.effect_line(summary)}\n"
    if args.output:
        atomic_write_files(
            Path(args.output),
            {
                "factorial.md": text.encode(),
                "factorial.json": json.dumps(json_safe(summary), indent=1).encode(),
                "factorial.png": factorial.chart_png(summary),
            },
        )
    console.emit(summary, text)


def run(args, console: Console) -> None:
    if args.output:
        check_output_dir(args.output)
    modes = [m for m in ("factorial", "factorial_plan") if getattr(args, m) is not None]
    if len(modes) > 1 or (modes and (args.a or args.b)):
        raise SceneEplbError("give two results A B, or --factorial, or --factorial-plan: one of them")
    if args.factorial_plan is not None:
        return _plan(args, console)
    if args.factorial is not None:
        return _factorial(args, console)
    if not (args.a and args.b):
        raise SceneEplbError("compare needs two results A B (or --factorial ARM=FILES for each of the four arms)")
    a, b = read_result(args.a), read_result(args.b)
    names = (args.name_a, args.name_b)
    c = compare(a, b, names)
    text = markdown(c, names)
    if args.output:
        atomic_write_files(
            Path(args.output),
            {
                "compare.md": text.encode(),
                "compare.json": json.dumps(json_safe(c.to_dict()), indent=1).encode(),
                "compare.png": chart_png(c, names),
            },
        )
    console.emit(c.to_dict(), text)
