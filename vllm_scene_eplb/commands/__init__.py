"""One module per `scene-eplb` command, each declaring its own arguments next to its code:
``HELP`` (and optionally ``DESCRIPTION``), ``add_arguments(parser)`` and ``run(args, console)``.
``COMMANDS`` is the order `scene-eplb --help` lists them in."""

from __future__ import annotations

from . import (
    advise,
    audit,
    bench,
    compare,
    convert,
    fit,
    hash_counts,
    inspect,
    pair_advise,
    preflight,
    record,
    report,
    score,
    screen,
    validate,
    warm_check,
    watch,
)

COMMANDS = {
    "inspect": inspect,
    "fit": fit,
    "validate": validate,
    "score": score,
    "convert": convert,
    "report": report,
    "record": record,
    "audit": audit,
    "watch": watch,
    "advise": advise,
    "pair-advise": pair_advise,
    "bench": bench,
    "compare": compare,
    "preflight": preflight,
    "screen": screen,
    "hash-counts": hash_counts,
    "warm-check": warm_check,
}
