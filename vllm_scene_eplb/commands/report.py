"""`scene-eplb report LAYOUT COUNTS [COUNTS ...] -o DIR`: report.md, per-rank load heat maps and scores.json."""

from __future__ import annotations

from ..formats import read_layout
from ..layouts.report import write_report
from ..planning.memory import memory_cost
from .arguments import geometry_args, hint, model_args, model_memory
from .console import Console
from .options import check_output_dir
from .scenes import read_scenes, scene_names, scenes_payload, scenes_text, warm_note

HELP = "Markdown report plus PNG heat maps of per-rank load before/after, one or several scenes"


def add_arguments(p) -> None:
    p.add_argument("layout")
    p.add_argument("counts", nargs="+", help="counts files, one per scene: each gets its scores and heat map")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="report directory (made if missing; its files are replaced only once every part of the report is ready)",
    )
    geometry_args(p)
    model_args(p)


def run(args, console: Console) -> None:
    check_output_dir(args.output)
    layout = read_layout(args.layout, hint(args))
    scenes = list(zip(scene_names(args.counts), read_scenes(args.counts, console, layout)))
    memory = memory_cost(model_memory(args), layout.geometry)
    with console.progress("scoring and drawing heat maps"):
        evals, md, pngs = write_report(layout, scenes, args.output, memory["summary"] if memory else None)
    warm = [note for (_, c), path in zip(scenes, args.counts) if (note := warm_note(c, path))]
    text = "\n".join([*warm, scenes_text(args.counts, evals)]) + (f"\n{memory['summary']}" if memory else "")
    payload = {"report": str(md), "heatmaps": [str(p) for p in pngs], "memory": memory, "notes": warm}
    console.emit(
        {**payload, **scenes_payload(args.counts, evals)},
        text + f"\nwrote {md} and {len(pngs)} heat map(s)",
    )
