"""`scene-eplb validate LAYOUT`: check a layout file, and that it fits a model."""

from __future__ import annotations

from ..errors import SceneEplbError
from ..formats import read_layout
from ..planning.model_geometry import read_model_geometry
from .arguments import geometry_args, hint
from .console import Console

HELP = "check a layout file (and that it fits a model)"


def add_arguments(p) -> None:
    p.add_argument("layout")
    p.add_argument("--model", help="model directory or config.json: check MoE layers and experts against it")
    geometry_args(p)


def run(args, console: Console) -> None:
    layout = read_layout(args.layout, hint(args))
    checks = []
    if args.model:
        model = read_model_geometry(args.model)
        ep = args.ep_size or layout.geometry.ep_size
        try:
            layout.check_model(len(model.moe_layers), model.num_experts, ep, model.moe_layers, model.num_layers)
        except SceneEplbError as exc:
            raise SceneEplbError(exc.problem, args.layout) from None
        checks.append(f"matches model {args.model}: {len(model.moe_layers)} MoE layers, {model.num_experts} experts")
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
