"""`scene-eplb fit COUNTS [COUNTS ...]`: fit a static layout to one or several scenes and print their scores."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import SceneEplbError
from ..fit import OBJECTIVES, FitOptions, fit
from ..fit.drafter_rows import DRAFTER_META, GUESS
from ..formats import LAYOUT_FORMATS, OWN_FORMAT, dropped_parts, format_name, write_layout
from ..layouts.dispatch import DISPATCH_ALGORITHMS
from ..layouts.evaluation import evaluate
from ..layouts.layout import Geometry
from ..layouts.peer import fit_peer
from ..layouts.scenes import check_scenes, normalise_weights
from ..planning.memory import memory_cost
from ..planning.model_files import ModelFiles
from ..planning.model_geometry import known_model
from .arguments import model_args, model_memory, read_model_arg
from .console import Console
from .options import check_output_file, integer
from .scenes import (
    check_model_counts,
    drafter_scores,
    layer_notes,
    moe_rows,
    read_scenes,
    refuse_empty_layers,
    scene_names,
    scenes_payload,
    scenes_text,
    unrouted_layers,
    warm_note,
)

HELP = "fit a layout to counts (one scene or several)"
DESCRIPTION = (
    "Fit a static layout: replica counts in the redundant-slot budget, placement, bounded swaps, the static "
    "table, validation; prints train/holdout scores per scene. Several counts files (scenes) give one layout "
    "for their mix, each normalised per layer."
)


def parse_weights(text: str | None, scenes: int) -> list[float] | None:
    """'0.5,0.3,0.2' into one positive finite weight per scene, or a clear error."""
    if text is None:
        return None
    try:
        weights = [float(x) for x in text.split(",")]
    except ValueError:
        raise SceneEplbError(f"--scene-weights {text!r}: expected numbers separated by commas, e.g. 0.5,0.3,0.2") from None
    try:
        normalise_weights(weights, scenes)  # checked now, before any counts file is read
    except SceneEplbError as exc:
        raise SceneEplbError(f"--scene-weights {text!r}: {exc.problem}") from None
    return weights


@dataclass(frozen=True)
class Routing:
    """The model's routing groups and top-k as a command resolved them, and where they came from."""

    expert_groups: int
    top_k: int | None
    source: str  # "--expert-groups", "--model", "counts metadata", a known model's shape or "default"


def resolve_routing(args: argparse.Namespace, scenes: list, model: ModelFiles | None, console: Console) -> Routing:
    """Routing groups: ``--expert-groups`` wins, else ``--model``'s config (n_group), else what the
    recorder wrote into the counts (every scene must agree), else those of the known model the
    counts' shape names (``known_model``: DeepSeek-V3's 8, said on stderr with how to override),
    else 1 (no groups)."""
    top_k = None
    if model is not None:
        if args.expert_groups is None:
            return Routing(model.geometry.expert_groups, model.geometry.top_k, "--model")
        top_k = model.geometry.top_k
    recorded = {(c.meta.get("expert_groups"), c.meta.get("top_k")) for c in scenes}
    if len(recorded) > 1:
        raise SceneEplbError(f"the counts files record different routing (expert_groups, top_k): {sorted(recorded, key=str)}")
    groups, recorded_top_k = recorded.pop()
    top_k = top_k or recorded_top_k
    if args.expert_groups is not None:
        return Routing(args.expert_groups, top_k, "--expert-groups")
    if isinstance(groups, int) and groups >= 1:
        return Routing(groups, top_k, "counts metadata")
    known = known_model(scenes[0].num_layers, scenes[0].num_experts)
    if known is not None and known.geometry.expert_groups > 1:
        console.warn(
            f"scene-eplb: note: neither --model nor the counts' metadata name the routing groups; the counts have "
            f"{known.describe()}: taking its {known.geometry.expert_groups} routing groups (config n_group). "
            "Override with --expert-groups N (1: none) or --model DIR"
        )
        return Routing(known.geometry.expert_groups, top_k or known.geometry.top_k, known.describe())
    return Routing(1, top_k, "default")


def add_arguments(p) -> None:
    p.add_argument("counts", nargs="+", help="counts files, one per scene (scene-eplb .npz, SGLang-style .json, recorder .pt)")
    p.add_argument("--ep-size", type=integer(1), required=True, help="expert-parallel ranks (EP size of the P node)")
    p.add_argument("--redundant", type=integer(0), required=True, help="redundant physical slots R (E + R divisible by ep-size)")
    p.add_argument("--nodes", type=integer(1), default=1, help="nodes the EP ranks span (default 1)")
    p.add_argument(
        "--dispatch",
        choices=DISPATCH_ALGORITHMS,
        default="static",
        help="ep_dispatch_algorithm the layout will run under; the fitter balances its real replica shares "
        "(static: it also fits how many source ranks each replica serves) (default static)",
    )
    p.add_argument(
        "--robust",
        action="store_true",
        help="per layer, pick risk-weighted counts that minimise the expected per-pass peak on the train passes",
    )
    p.add_argument(
        "--scene-weights",
        metavar="W1,W2,...",
        help="one weight per counts file, e.g. 0.5,0.3,0.2 (the share of traffic each scene stands for; default equal)",
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="mean",
        help="with several scenes: balance their weighted mix (mean), or also refit the layers whose worst "
        "scene is furthest from balance toward it (worst) (default mean)",
    )
    p.add_argument(
        "--expert-groups",
        type=integer(1),
        default=None,
        metavar="N",
        help="the model's routing groups (config.json n_group; DeepSeek-V3/R1: 8). Placement then spreads every "
        "group and its halvings of neighbouring ids evenly over ranks, which held up better on other scenes "
        "of real DeepSeek-V3 counts (benchmarks/bench_fit_vs_vllm.py). Default: from --model, else from "
        "the counts' metadata (the recorder writes it), else from the shape of a known model (DeepSeek-V3/R1's "
        "61 layers x 256 experts: 8, said on stderr), else 1 (no groups)",
    )
    p.add_argument(
        "--allow-empty-layers",
        action="store_true",
        help="fit counts whose MoE layers (per --model, the counts' metadata or a known model's shape) are all "
        "zero, to an even load there (refused otherwise: a recorder that missed them?)",
    )
    p.add_argument(
        "--drafter-layers",
        type=integer(0),
        default=0,
        metavar="N",
        help="rows for a speculative drafter's N MoE layers (DeepSeek's MTP layers: num_nextn_predict_layers) "
        "when the counts have none; counts recorded with the drafter on carry them, fitted from their own counts "
        "(default 0)",
    )
    model_args(p)
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="layout file to write (its folder must exist; replaced atomically, and only once the fit succeeded)",
    )
    p.add_argument(
        "--format",
        type=format_name,
        choices=LAYOUT_FORMATS,
        default=OWN_FORMAT,
        help=f"layout file format (default {OWN_FORMAT}; native, its old name, still reads)",
    )


def run(args, console: Console) -> None:
    check_output_file(args.output, args.counts, args.model)
    weights = parse_weights(args.scene_weights, len(args.counts))
    model = read_model_arg(args)
    scenes = read_scenes(args.counts, console)
    check_scenes(scenes, scenes[0].num_experts)
    if model is not None:
        for counts, path in zip(scenes, args.counts):
            check_model_counts(model, counts, path)
    rows = moe_rows(scenes, model)
    if not args.allow_empty_layers:
        refuse_empty_layers(scenes, args.counts, rows, args.model, "fits them to an even load")
    routing = resolve_routing(args, scenes, model, console)
    geometry = Geometry(scenes[0].num_experts, args.redundant, args.ep_size, args.nodes)
    options = FitOptions(
        geometry, dispatch=args.dispatch, robust=args.robust, expert_groups=routing.expert_groups, objective=args.objective
    )
    prices = model_memory(args, model)
    with console.progress(f"fitting {scenes[0].num_layers} layers to {len(scenes)} scene(s)"):
        layout = fit(scenes, options, weights, rows.layers if rows else None, args.drafter_layers)
    memory = memory_cost(prices, geometry, len(layout.drafter_layers))
    layout.meta["top_k"] = routing.top_k
    names = scene_names(args.counts)
    peer = fit_peer(layout, scenes)
    evals = [evaluate(layout, c, peer) for c in scenes]
    drafter, drafter_text = drafter_scores(layout, scenes, args.counts)
    out = write_layout(layout, args.output, args.format)  # last: nothing is written unless all of the above held
    notes = [note for c, path in zip(scenes, args.counts) for note in layer_notes(c, path, rows, args.model)]
    notes += [note for c, path in zip(scenes, args.counts) if (note := warm_note(c, path))]
    unrouted = unrouted_layers(scenes, layout.moe_layers)
    if unrouted:
        notes.append(f"MoE layers {unrouted} have no counts in any scene: fitted to an even load, their scores say nothing")
    guessed = layout.meta.get(DRAFTER_META, {}).get("guessed")
    if guessed:
        notes.append(f"the drafter's MoE layers {guessed} have no counts: their rows are {GUESS}")
        console.say(f"scene-eplb: note: {notes[-1]}")
    lines = [f"routing groups: {routing.expert_groups} (from {routing.source})", *notes]
    if len(scenes) > 1:
        lines.append(
            "scene weights: "
            + ", ".join(f"{n} {w:.3g}" for n, w in zip(names, layout.meta["scene_weights"]))
            + f"; objective {args.objective}"
        )
    lines.append(scenes_text(args.counts, evals))
    lines.append(drafter_text)
    if memory:
        lines.append(memory["summary"])
    dropped, note = dropped_parts(layout, args.format, out)
    lines.append(f"wrote {out} ({args.format}){note}")
    payload = {
        "output": str(out),
        "format": args.format,
        "dropped": dropped,
        "expert_groups": routing.expert_groups,
        "expert_groups_from": routing.source,
        "memory": memory,
        "notes": notes,
        "drafter": drafter,
        **scenes_payload(args.counts, evals, layout.meta["scene_weights"]),
    }
    console.emit(payload, "\n".join(line for line in lines if line))
