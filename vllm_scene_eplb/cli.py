"""`scene-eplb`: dispatch to one command of ``vllm_scene_eplb.commands`` and turn its errors into one line.

Offline commands (inspect, fit, validate, score, convert, report) run on CPU with no engine; record,
audit, bench and compare talk to a running server or read its results.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .commands import COMMANDS
from .commands.common import Console, output_args
from .errors import SceneEplbError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scene-eplb",
        description="Scene-specific static EPLB: fit an expert layout from recorded routing counts, "
        "check it, score it and convert it for vLLM, SGLang and vLLM-Ascend. Runs on CPU, no engine needed.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        sp = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP))
        module.add_arguments(sp)
        output_args(sp)
        sp.set_defaults(run=module.run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args, Console(quiet=args.quiet, json=args.json))
    except SceneEplbError as exc:
        print(f"scene-eplb: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (e.g. piped into head)
        sys.stderr.close()
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
