"""`scene-eplb convert IN --to FORMAT -o OUT`: counts or a layout into another format."""

from __future__ import annotations

from dataclasses import replace

from ..errors import SceneEplbError
from ..formats import (
    COUNTS_FORMATS,
    LAYOUT_FORMATS,
    dropped_parts,
    file_kind,
    format_name,
    read_counts,
    read_layout,
    write_counts,
    write_layout,
)
from ..layouts.counts import Counts
from ..layouts.layout import Layout
from .arguments import geometry_args, hint
from .console import Console
from .options import check_output_file

HELP = "convert counts or a layout between formats"
DESCRIPTION = f"Counts formats: {', '.join(COUNTS_FORMATS)}. Layout formats: {', '.join(LAYOUT_FORMATS)}."


def add_arguments(p) -> None:
    p.add_argument("input")
    p.add_argument(
        "--to",
        required=True,
        type=format_name,
        choices=sorted(set(COUNTS_FORMATS + LAYOUT_FORMATS)),
        help="target format (native, the old name of scene-eplb, still reads)",
    )
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--moe-layers", help="layout rows that are MoE layers, e.g. 3-60 (for vllm-ascend export of a bare layout)")
    geometry_args(p)


def parse_layers(text: str) -> tuple[int, ...]:
    """'3-60' or '3,5,7' or '3-10,12' into row indices: non-negative, each range ascending, none twice."""
    out: list[int] = []
    usage = f"--moe-layers {text!r}: expected ascending ranges of layer rows like 3-60 or 3,5,7"
    for part in text.split(","):
        lo_text, dash, hi_text = part.strip().partition("-")
        if not lo_text.isdigit() or (dash and not hi_text.isdigit()):
            raise SceneEplbError(usage)
        lo, hi = int(lo_text), int(hi_text) if dash else int(lo_text)
        if hi < lo:
            raise SceneEplbError(f"{usage} (range {lo}-{hi} runs backwards)")
        if hi - lo > 1 << 20:
            raise SceneEplbError(f"{usage} (range {lo}-{hi} is larger than any model)")
        out.extend(range(lo, hi + 1))
    if len(set(out)) != len(out):
        raise SceneEplbError(f"{usage} (a row is named twice)")
    return tuple(out)


def run(args, console: Console) -> None:
    check_output_file(args.output, [args.input])
    layers = None if args.moe_layers is None else parse_layers(args.moe_layers)
    kind = file_kind(args.input)
    dropped: list[str] = []
    note = ""
    obj: Counts | Layout
    if kind == "counts":
        if args.to not in COUNTS_FORMATS:
            raise SceneEplbError(f"counts convert to one of {', '.join(COUNTS_FORMATS)}, not {args.to!r}", args.input)
        if layers is not None:
            raise SceneEplbError("--moe-layers applies to layouts; counts keep every layer row", args.input)
        with console.progress(f"reading {args.input}"):
            obj = read_counts(args.input)
        out = write_counts(obj, args.output, args.to)
        dropped, note = dropped_parts(obj, args.to, out)
    else:
        layout = read_layout(args.input, hint(args))
        if layers is not None:
            try:
                layout = replace(layout, moe_layers=layers)
            except SceneEplbError as exc:
                raise SceneEplbError(f"--moe-layers: {exc.problem}", args.input) from None
        obj = layout
        out = write_layout(layout, args.output, args.to)
        dropped, note = dropped_parts(obj, args.to, out)
    console.emit(
        {"input": args.input, "kind": kind, "output": str(out), "format": args.to, "dropped": dropped},
        f"wrote {out} ({kind}, {args.to})" + note,
    )
