"""`scene-eplb inspect COUNTS [--model DIR]`: shape, written ring entries, routed layers and skew of a counts
file; with a model, that the counts are its and what one redundant slot per rank costs in memory and
KV cache. MoE layers left all zero are flagged: exit 2 after the summary, unless --allow-empty-layers."""

from __future__ import annotations

import numpy as np

from ..errors import SceneEplbError
from ..formats import read_counts
from ..layouts.drafter import target_counts
from ..planning.memory import memory_cost
from .arguments import model_args, model_memory, read_model_arg
from .console import Console
from .scenes import check_model_counts, empty_layers, empty_layers_line, layer_notes, moe_rows

HELP = "summarise and validate a counts file"


def add_arguments(p) -> None:
    p.add_argument("counts", help="counts: scene-eplb .npz, SGLang-style .json or recorder .pt")
    p.add_argument(
        "--allow-empty-layers",
        action="store_true",
        help="exit 0 on MoE layers (per --model, the counts' metadata or a known model's shape) that are all zero "
        "(flagged with exit 2 otherwise, after the summary)",
    )
    model_args(p)


def run(args, console: Console) -> None:
    model = read_model_arg(args)
    with console.progress(f"reading {args.counts}"):
        c = read_counts(args.counts)
    if model is not None:
        check_model_counts(model, c, args.counts)
    rows = moe_rows([c], model)
    target = target_counts(c)  # the drafter's rows, if any, are a note of their own (``layer_notes``)
    total = target.total()
    active = target.active_layers()
    per_layer = total.sum(axis=1)
    skew = [float(total[layer].max() / total[layer].mean()) for layer in active]
    notes = layer_notes(c, args.counts, rows, args.model)
    payload = {
        "file": args.counts,
        "shape": list(c.data.shape),
        "entries_written": int(c.written_entries().size),
        "active_layers": active.tolist(),
        "all_zero_layers": [int(i) for i in np.flatnonzero(per_layer == 0)],
        "assignments_per_layer": {"min": int(per_layer[active].min()) if active.size else 0, "max": int(per_layer.max())},
        "expert_skew_max_over_mean": {"median": float(np.median(skew)) if skew else None, "worst": max(skew) if skew else None},
        "physical_shape": None if c.physical is None else list(c.physical.shape),
        "source_shape": None if c.sources is None else list(c.sources.shape),
        "meta": c.meta,
        "counts_sha256": c.digest(),
        "memory": memory_cost(model_memory(args, model), None),
        "moe_layers_from": rows.source if rows else None,
        "empty_moe_layers": empty_layers(c, rows),
        "notes": notes,
    }
    zero = payload["all_zero_layers"]
    text = (
        f"{args.counts}: counts [T={c.num_entries}, L={c.num_layers}, E={c.num_experts}], "
        f"{payload['entries_written']} ring entr{'y' if payload['entries_written'] == 1 else 'ies'} written\n"
        f"  routed layers: {active.size} (all-zero: {zero[:10]}{'...' if len(zero) > 10 else ''})\n"
        f"  assignments per routed layer: {payload['assignments_per_layer']['min']}..{payload['assignments_per_layer']['max']}\n"
        + (f"  expert load max/mean: median {np.median(skew):.2f}, worst {max(skew):.2f}\n" if skew else "")
        + (
            f"  measured replica traffic: physical_count [T, L, P={c.physical.shape[2]}] (totals match)\n"
            if c.physical is not None
            else ""
        )
        + (
            f"  per-source counts: source_count [S={c.sources.shape[0]}, L, E] (their sum matches)\n"
            if c.sources is not None
            else ""
        )
        + "".join(f"  {note}\n" for note in notes)
        + f"  sha256 {c.digest()}"
        + (f"\n  {payload['memory']['summary']}" if payload["memory"] else "")
    )
    console.emit(payload, text)
    empty = empty_layers_line(c, args.counts, rows, args.model)
    if empty and not args.allow_empty_layers:
        raise SceneEplbError(f"{empty}; --allow-empty-layers accepts them")
