"""`scene-eplb score LAYOUT COUNTS`: old vs new, train vs holdout, ideal and static."""

from __future__ import annotations

from ..errors import SceneEplbError
from ..evaluation import evaluate
from ..formats import read_counts, read_layout
from .common import Console, geometry_args, hint, summary_text

HELP = "score a layout on counts (train/holdout, ideal and static dispatch)"


def add_arguments(p) -> None:
    p.add_argument("layout")
    p.add_argument("counts")
    geometry_args(p)


def run(args, console: Console) -> None:
    layout = read_layout(args.layout, hint(args))
    with console.progress(f"reading {args.counts}"):
        counts = read_counts(args.counts)
    try:
        ev = evaluate(layout, counts)
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, args.counts) from None
    console.emit({"summary": ev.summary(), "layers": ev.rows()}, summary_text(ev))
