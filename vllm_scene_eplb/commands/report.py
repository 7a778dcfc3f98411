"""`scene-eplb report LAYOUT COUNTS -o DIR`: report.md, per-rank load heat maps and scores.json."""

from __future__ import annotations

from ..formats import read_counts, read_layout
from ..report import write_report
from .common import Console, geometry_args, hint, summary_text

HELP = "Markdown report plus PNG heat maps of per-rank load before/after"


def add_arguments(p) -> None:
    p.add_argument("layout")
    p.add_argument("counts")
    p.add_argument("-o", "--output", required=True, help="report directory")
    geometry_args(p)


def run(args, console: Console) -> None:
    layout = read_layout(args.layout, hint(args))
    with console.progress(f"reading {args.counts}"):
        counts = read_counts(args.counts)
    with console.progress("scoring and drawing heat maps"):
        ev, md, png = write_report(layout, counts, args.output)
    console.emit({"report": str(md), "heatmap": str(png), "summary": ev.summary()}, summary_text(ev) + f"\nwrote {md} and {png}")
