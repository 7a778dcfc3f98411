"""`scene-eplb watch --url URL`: live layout fitness of a running server, refreshed in place.

One character per MoE layer: a heat strip of its live score (max/mean EP rank load of the last
window) against the loaded layout's expectation, then the median and worst layer and the drift
state. ``--once --json`` prints the status route's ``live`` object for scripts. Exit status 1
while the server reports drift, so cron and alerting can use it as it is.
"""

from __future__ import annotations

import sys
import time

from ..client.record import answer
from ..protocol import LiveAnswer
from ..terminal import printable
from .arguments import server_args
from .console import Console
from .options import integer, number

HELP = "live layout fitness of a running server (score per layer vs the layout's expectation; exit 1 on drift)"
DESCRIPTION = __doc__.split("\n\n", 1)[1].replace("\n", " ")
SHADES = " .:-=+*#%@"  # score 1.0 ... >= 1 + 2 x (len - 1) / 100, one step per 2%


def add_arguments(p) -> None:
    server_args(p)
    p.add_argument("--interval", type=number(0.1, 86400), default=5.0, help="seconds between refreshes (default 5)")
    p.add_argument("--once", action="store_true", help="print once and exit (with --json: the live object)")
    p.add_argument("--count", type=integer(0), default=0, help="refreshes before exiting (default 0: until Ctrl-C)")


def shade(value: float) -> str:
    """One character for a score: blank at 1.0, '@' at 1.18 or worse."""
    return SHADES[min(len(SHADES) - 1, max(0, int((value - 1.0) * 50)))]


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def render(live: LiveAnswer | None, url: str) -> str:
    """The text view of one live answer (its strings escaped when printed: ``terminal.printable``)."""
    if live is None or live.median is None or live.worst is None:
        return f"{url}: no live window with traffic yet (live fitness reads every window of traffic)"
    exp = live.expected_median
    lines = [
        f"{url}  window {live.window_seconds:.1f} s  passes {live.passes}  dispatch {live.dispatch}",
        f"  live      median {live.median:.4f}  worst {live.worst:.4f}",
        "  expected  "
        + (
            "none (the layout carries no expectation for this dispatch: no drift alarm)"
            if exp is None
            else f"median {exp:.4f}  worst {_num(live.expected_worst)}  alarm above {_num(live.threshold)}"
        ),
        _measured_line(live),
        _time_line(live),
        f"  drift     {'YES: record the new scene and refit' if live.drift else 'no'}",
        f"  layers    {''.join(shade(v) for v in live.per_layer or ())}   ('{SHADES[1]}' +2% ... '{SHADES[-1]}' +18% over 1.0)",
    ]
    worst = sorted(zip(live.per_layer or (), live.layers), reverse=True)[:5]
    lines.append("  worst     " + "  ".join(f"layer {layer}: {v:.4f}" for v, layer in worst))
    return "\n".join(lines)


def _measured_line(live: LiveAnswer) -> str:
    m = live.measured
    if not m:
        return "  measured  none (this engine's adapter does not count physical slots)"
    return (
        f"  measured  median {m.median:.4f}  worst {m.worst:.4f}  (replica traffic; dispatch fidelity error "
        + _num(live.fidelity)
        + ")"
    )


def _time_line(live: LiveAnswer) -> str:
    t = live.time
    if t is None:
        return "  time      off (scene_eplb.time_moe: true times each rank's experts)"
    share = "n/a" if t.moe_share is None else f"{100 * t.moe_share:.1f}%"
    return f"  time      median {t.median:.4f}  worst {t.worst:.4f}  (max/mean rank MoE ms; MoE {share} of step time)"


def run(args, console: Console) -> None:
    refreshes, live = 0, None
    while True:
        live = answer(args.url, "status", args.api_key, timeout=30).live
        if args.once or console.json:
            console.emit(live.to_wire() if live else {}, render(live, args.url))
        else:
            sys.stdout.write("\x1b[H\x1b[2J" + printable(render(live, args.url), lines=True))
            sys.stdout.write(f"\n\n  (every {args.interval:g} s; Ctrl-C stops)\n")
            sys.stdout.flush()
        refreshes += 1
        if args.once or (args.count and refreshes >= args.count):
            break
        time.sleep(args.interval)
    if live and live.drift:
        raise SystemExit(1)
