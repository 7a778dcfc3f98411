"""`scene-eplb record start|stop|dump|status|native_load --url URL`: drive a running server's recorder."""

from __future__ import annotations

from ..client.record import answer
from ..errors import SceneEplbError
from ..protocol import ACTIONS, RANK_KEYS, DumpAnswer, NativeLoadAnswer
from .arguments import server_args
from .console import Console
from .options import number

HELP = "control a running server's recorder: start | stop | dump | status | native_load"
DESCRIPTION = (
    "Drive the plugin's routes on a vLLM server started with scene_eplb in --additional-config and "
    "VLLM_PLUGINS=scene_eplb. dump answers the path of the counts file the server wrote inside its dump_dir. "
    "native_load answers the engine's own expert-load counters over the last record in logical ids "
    "(vLLM-Ascend with dynamic EPLB), to cross-check a dump."
)
# what a status line shows: the role, then what each rank reports of its recorder and layout
SHOWN = ("role", *(k for k in RANK_KEYS if k not in ("ep_rank", "dp_rank", "tp_rank", "skipped_passes")))


def add_arguments(p) -> None:
    p.add_argument("action", choices=ACTIONS)
    server_args(p)
    p.add_argument(
        "--keep-skipped",
        action="store_true",
        help="dump: write the record even if a rank skipped passes whose rows it could not attribute (refused "
        "otherwise: the counts would undercount; the file's metadata then says how many)",
    )
    p.add_argument(
        "--timeout", type=number(0, 86400, low_open=True), default=300.0, help="seconds to wait for the server (default 300)"
    )


def run(args, console: Console) -> None:
    if args.keep_skipped and args.action != "dump":
        raise SceneEplbError("--keep-skipped applies to dump only")
    result = answer(args.url, args.action, args.api_key, args.timeout, keep_skipped=args.keep_skipped)
    if isinstance(result, DumpAnswer):
        text = f"wrote {result.path}  shape {list(result.shape)}  ring entries written {result.entries_written}"
    elif isinstance(result, NativeLoadAnswer):
        text = (
            f"engine counters over the last record: {sum(map(sum, result.counts or ()))} assignments in "
            f"{len(result.counts or ())} MoE layers"
            if result.available
            else f"not available: {result.reason}"
        )
    else:
        wire = result.to_wire()
        text = "  ".join(f"{k}={wire[k]}" for k in SHOWN)
    console.emit(result.to_wire(), text)
