"""`scene-eplb`: dispatch to one command of ``vllm_scene_eplb.commands`` and turn its errors into one line.

Offline commands (inspect, fit, validate, score, convert, report) run on CPU with no engine; record,
audit, bench and compare talk to a running server or read its results.

Every failure ends with one line on stderr (control characters escaped: ``terminal.printable``) and a non-zero exit: bad input or options
``scene-eplb: error: FILE: problem`` (exit 2); an exception nobody expected is a bug and says so
(exit 3), with its traceback only under ``--debug``.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from . import __version__
from .commands import COMMANDS
from .commands.arguments import output_args
from .commands.console import Console
from .errors import SceneEplbError
from .terminal import printable

REPORT_BUGS = "the vllm-scene-eplb issue tracker"


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error, the same shape as every other error of the CLI."""

    def error(self, message: str):
        self.exit(2, f"scene-eplb: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="scene-eplb",
        description="Scene-specific static EPLB: fit an expert layout from recorded routing counts, "
        "check it, score it and convert it for vLLM, SGLang and vLLM-Ascend. Runs on CPU, no engine needed.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
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
        print(f"scene-eplb: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (e.g. piped into head)
        sys.stderr.close()
        return 141
    except MemoryError:
        print("scene-eplb: error: out of memory (an input larger than this machine can hold?)", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - anything else is a bug: one line, the traceback on request
        if args.debug:
            traceback.print_exc()
        where = "" if args.debug else "; rerun with --debug for the traceback"
        print(
            f"scene-eplb: internal error (a bug, please report it with the command line to {REPORT_BUGS}): "
            f"{type(exc).__name__}: {printable(str(exc))}{where}",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
