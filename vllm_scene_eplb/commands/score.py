"""`scene-eplb score LAYOUT COUNTS [COUNTS ...]`: old vs vLLM's policy vs new, train vs holdout, ideal and static, per scene."""

from __future__ import annotations

from ..formats import read_layout
from ..layouts.evaluation import evaluate
from ..layouts.peer import fit_peer
from .arguments import geometry_args, hint
from .console import Console
from .scenes import drafter_scores, read_scenes, scenes_payload, scenes_text

HELP = "score a layout on counts (train/holdout, ideal and static dispatch), one or several scenes"


def add_arguments(p) -> None:
    p.add_argument("layout")
    p.add_argument("counts", nargs="+", help="counts files, one per scene: each is scored on its own")
    geometry_args(p)


def run(args, console: Console) -> None:
    layout = read_layout(args.layout, hint(args))
    scenes = read_scenes(args.counts, console, layout)
    peer = fit_peer(layout, scenes)
    evals = [evaluate(layout, counts, peer) for counts in scenes]
    drafter, drafter_text = drafter_scores(layout, scenes, args.counts)
    payload = {**scenes_payload(args.counts, evals), "drafter": drafter}
    console.emit(payload, "\n".join(t for t in (scenes_text(args.counts, evals), drafter_text) if t))
