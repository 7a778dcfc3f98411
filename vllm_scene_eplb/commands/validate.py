"""`scene-eplb validate LAYOUT`: check a layout file, and that it fits a model."""

from __future__ import annotations

from ..formats import read_layout
from .arguments import check_layout_model, geometry_args, hint, model_arg, read_model_arg
from .console import Console

HELP = "check a layout file (and that it fits a model)"


def add_arguments(p) -> None:
    p.add_argument("layout")
    model_arg(p, help="the model's folder or its config.json: check the layout's layers, MoE layers and experts against it")
    geometry_args(p)


def run(args, console: Console) -> None:
    layout = read_layout(args.layout, hint(args))
    checks = []
    model = read_model_arg(args)
    if model is not None:
        check_layout_model(layout, model, args.layout, args.ep_size or layout.geometry.ep_size)
        moe, experts = model.geometry.moe_layers, model.geometry.num_experts
        checks.append(f"matches model {args.model}: {len(moe)} MoE layers, {experts} experts")
    g = layout.geometry
    payload = {
        "file": args.layout,
        "valid": True,
        "layout_hash": layout.digest(),
        "geometry": g.to_dict(),
        "moe_layers": list(layout.moe_layers),
        "drafter_layers": list(layout.drafter_layers),
        "meta": layout.meta,
        "checks": checks,
    }
    drafter = layout.drafter_layers
    rows = f" + the drafter's MoE layers {list(drafter)} (rows of their own)" if drafter else ""
    text = (
        f"{args.layout}: valid layout {layout.digest()}: {layout.num_target_layers} layers ({len(layout.moe_layers)} MoE){rows}, "
        f"{g.num_experts} experts + {g.num_redundant} redundant, ep_size {g.ep_size}, {g.num_nodes} node(s)"
        + "".join(f"\n  {c}" for c in checks)
    )
    console.emit(payload, text)
