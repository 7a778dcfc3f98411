"""`scene-eplb report LAYOUT COUNTS [COUNTS ...] -o DIR`: report.md, per-rank load heat maps and scores.json."""

from __future__ import annotations

from ..formats import read_layout
from ..layouts.report import write_report
from ..planning.memory import memory_cost
from .arguments import check_layout_model, geometry_args, hint, model_args, model_memory, read_model_arg
from .console import Console
from .options import check_output_dir
from .scenes import check_model_counts, drafter_scores, read_scenes, scene_names, scenes_payload, scenes_text, warm_note

HELP = "Markdown report plus PNG heat maps of per-rank load: old (linear), vLLM's policy and the layout, one or several scenes"


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
    check_output_dir(args.output, args.model)
    model = read_model_arg(args)
    layout = read_layout(args.layout, hint(args))
    if model is not None:
        check_layout_model(layout, model, args.layout, layout.geometry.ep_size)
    counts = read_scenes(args.counts, console, layout)
    if model is not None:
        for c, path in zip(counts, args.counts):
            check_model_counts(model, c, path)
    scenes = list(zip(scene_names(args.counts), counts))
    memory = memory_cost(model_memory(args, model), layout.geometry, len(layout.drafter_layers))
    groups = model.geometry.expert_groups if model is not None else None  # vLLM reads n_group from the model
    with console.progress("fitting vLLM's policy, scoring and drawing heat maps"):
        evals, md, pngs = write_report(
            layout, scenes, args.output, memory["summary"] if memory else None, groups, "--model" if groups else ""
        )
    warm = [note for (_, c), path in zip(scenes, args.counts) if (note := warm_note(c, path))]
    drafter, drafter_text = drafter_scores(layout, [c for _, c in scenes], args.counts)
    text = "\n".join(t for t in (*warm, scenes_text(args.counts, evals), drafter_text) if t) + (
        f"\n{memory['summary']}" if memory else ""
    )
    payload = {"report": str(md), "heatmaps": [str(p) for p in pngs], "memory": memory, "notes": warm}
    payload |= scenes_payload(args.counts, evals)
    console.emit({**payload, "drafter": drafter}, text + f"\nwrote {md} and {len(pngs)} heat map(s)")
