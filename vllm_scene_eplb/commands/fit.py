"""`scene-eplb fit COUNTS`: fit a static layout and print its train/holdout scores."""

from __future__ import annotations

from ..dispatch import DISPATCH_ALGORITHMS
from ..evaluation import evaluate
from ..fit import FitOptions, fit
from ..formats import LAYOUT_FORMATS, read_counts, write_layout
from ..layout import Geometry
from .common import Console, summary_text

HELP = "fit a layout to counts"
DESCRIPTION = ("Fit a static layout: replica counts in the redundant-slot budget, placement, bounded swaps, validation; "
               "prints train/holdout scores.")


def add_arguments(p) -> None:
    p.add_argument("counts")
    p.add_argument("--ep-size", type=int, required=True, help="expert-parallel ranks (EP size of the P node)")
    p.add_argument("--redundant", type=int, required=True, help="redundant physical slots R (E + R divisible by ep-size)")
    p.add_argument("--nodes", type=int, default=1, help="nodes the EP ranks span (default 1)")
    p.add_argument("--dispatch", choices=DISPATCH_ALGORITHMS, default="static",
                   help="ep_dispatch_algorithm the layout will run under; the fitter balances its real replica shares (default static)")
    p.add_argument("--robust", action="store_true",
                   help="per layer, pick risk-weighted counts that minimise the expected per-pass peak on the train passes")
    p.add_argument("--expert-groups", type=int, default=1, metavar="N",
                   help="the model's routing groups (config.json n_group; DeepSeek-V3/R1: 8). Placement then spreads every "
                        "group and its halvings of neighbouring ids evenly over ranks, which held up better on other scenes "
                        "of real DeepSeek-V3 counts (benchmarks/bench_fit_vs_vllm.py). Default 1: no groups")
    p.add_argument("-o", "--output", required=True, help="layout file to write")
    p.add_argument("--format", choices=LAYOUT_FORMATS, default="native", help="layout file format (default native)")


def run(args, console: Console) -> None:
    with console.progress(f"reading {args.counts}"):
        counts = read_counts(args.counts)
    geometry = Geometry(counts.num_experts, args.redundant, args.ep_size, args.nodes)
    options = FitOptions(geometry, dispatch=args.dispatch, robust=args.robust, expert_groups=args.expert_groups)
    with console.progress(f"fitting {counts.num_layers} layers"):
        layout = fit(counts, options)
        ev = evaluate(layout, counts)
    out = write_layout(layout, args.output, args.format)
    console.emit({"output": str(out), "format": args.format, "summary": ev.summary(), "layers": ev.rows()},
                 summary_text(ev) + f"\nwrote {out} ({args.format})")
