"""`scene-eplb warm-check BEFORE AFTER --share S [--margin M] [--stamp COUNTS]`: a cache scene proven
warm from two reads of the server's /metrics (``ab.warm``), and the measured share stamped into the
record it describes."""

from __future__ import annotations

from ..ab.warm import MARGIN, check_warm, read_page, read_warm, stamp, warm_line, warm_meta
from .console import Console
from .options import number

HELP = "prove a cache scene warm from two /metrics reads (prefix-cache hits over queries per DP engine)"
DESCRIPTION = (
    "Reads vLLM's prefix-cache counters (vllm:prefix_cache_hits / vllm:prefix_cache_queries, one series per DP "
    "engine) on two saved /metrics pages and refuses, in one line, when no hit moved between them, a DP engine "
    "served nothing, or any engine's hit share is under the scene's by more than the margin. With --stamp, "
    "writes the measured share into that counts file's metadata (atomically, its checksum renewed), which fit "
    "and report print. collect.sh runs it after seeding (before it records) and around the record."
)


def add_arguments(p) -> None:
    p.add_argument("before", help="the server's /metrics page saved before the load")
    p.add_argument("after", help="the same page saved after it")
    p.add_argument("--share", type=number(0, 1, low_open=True, high_open=True), required=True, help="the scene's prefix share")
    p.add_argument(
        "--margin", type=number(0, 1), default=MARGIN, help=f"how far under the share a DP engine may hit (default {MARGIN})"
    )
    p.add_argument("--stamp", metavar="COUNTS", help="a scene-eplb counts file the reads describe: write the share into it")


def run(args, console: Console) -> None:
    reading = read_warm(read_page(args.before), read_page(args.after))
    check_warm(reading, args.share, args.margin)
    meta = warm_meta(reading, args.share, args.margin)
    if args.stamp:
        stamp(args.stamp, meta)
    console.emit(
        {**meta, "stamped": args.stamp},
        f"warm: {warm_line(meta)}, {reading.hits:,} of {reading.queries:,} queried tokens"
        + (f"\nwrote it into {args.stamp}" if args.stamp else ""),
    )
