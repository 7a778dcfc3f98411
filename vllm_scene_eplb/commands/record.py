"""`scene-eplb record start|stop|dump|status --url URL`: drive a running server's recorder."""

from __future__ import annotations

from ..client.record import call
from ..protocol import ACTIONS
from .common import Console, server_args

HELP = "control a running server's recorder: start | stop | dump | status"
DESCRIPTION = ("Drive the plugin's routes on a vLLM server started with scene_eplb in --additional-config and "
               "VLLM_PLUGINS=scene_eplb. dump answers the path of the counts file the server wrote inside its dump_dir.")
SHOWN = ("role", "observer", "layout_hash", "redundant_slots", "dispatch", "entries_written", "passes_recorded")


def add_arguments(p) -> None:
    p.add_argument("action", choices=ACTIONS)
    server_args(p)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the server (default 300)")


def run(args, console: Console) -> None:
    result = call(args.url, args.action, args.api_key, args.timeout)
    if args.action == "dump":
        text = f"wrote {result.get('path')}  shape {result.get('shape')}  ring entries written {result.get('entries_written')}"
    else:
        text = "  ".join(f"{k}={result[k]}" for k in SHOWN if k in result)
    console.emit(result, text)
