"""`scene-eplb inspect COUNTS [--model DIR]`: shape, written ring entries, routed layers and skew of a counts
file; with a model, what one redundant slot per rank costs in memory and KV cache."""

from __future__ import annotations

import numpy as np

from ..formats import read_counts
from ..layouts.drafter import target_counts
from ..planning.memory import memory_cost
from ..planning.model_geometry import read_model_geometry
from .arguments import model_args, model_memory
from .console import Console
from .scenes import layer_notes

HELP = "summarise and validate a counts file"


def add_arguments(p) -> None:
    p.add_argument("counts", help="counts: scene-eplb .npz, SGLang-style .json or recorder .pt")
    model_args(p)


def run(args, console: Console) -> None:
    with console.progress(f"reading {args.counts}"):
        c = read_counts(args.counts)
    target = target_counts(c)  # the drafter's rows, if any, are a note of their own (``layer_notes``)
    total = target.total()
    active = target.active_layers()
    per_layer = total.sum(axis=1)
    skew = [float(total[layer].max() / total[layer].mean()) for layer in active]
    notes = layer_notes(c, args.counts, read_model_geometry(args.model).hash_layers if args.model else ())
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
        "memory": memory_cost(model_memory(args), None),
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
