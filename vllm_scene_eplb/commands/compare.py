"""`scene-eplb compare A B`: deltas between two bench results (refuses different N/C/r)."""

from __future__ import annotations

import json
from pathlib import Path

from ..fileio import atomic_write_files
from ..harness.compare import chart_png, compare, markdown
from ..harness.results import read_result
from .common import Console, json_safe
from .options import check_output_dir

HELP = "deltas between two bench results (refuses different N/C/r)"


def add_arguments(p) -> None:
    p.add_argument("a", help="reference result (e.g. linear layout)")
    p.add_argument("b", help="result to compare (e.g. fitted layout)")
    p.add_argument("--name-a", default="A")
    p.add_argument("--name-b", default="B")
    p.add_argument("-o", "--output", help="directory for compare.md, compare.json and compare.png")


def run(args, console: Console) -> None:
    if args.output:
        check_output_dir(args.output)
    a, b = read_result(args.a), read_result(args.b)
    names = (args.name_a, args.name_b)
    c = compare(a, b, names)
    text = markdown(c, names)
    if args.output:
        atomic_write_files(
            Path(args.output),
            {
                "compare.md": text.encode(),
                "compare.json": json.dumps(json_safe(c.to_dict()), indent=1).encode(),
                "compare.png": chart_png(c, names),
            },
        )
    console.emit(c.to_dict(), text)
