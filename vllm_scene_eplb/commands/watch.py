"""`scene-eplb watch --url URL`: live layout fitness of a running server, refreshed in place.

One character per MoE layer: a heat strip of its live score (max/mean EP rank load of the last
window) against the loaded layout's expectation, then the median and worst layer and the drift
state; below it the node's flow (P supply, D demand: completions and tokens per second, busy share,
queue, batch against its maximum, first-token time, steps short of work). ``--once --json`` prints
the status route's ``live`` object, with the flow under ``flow``, for scripts. Exit status 1
while the server reports drift, so cron and alerting can use it as it is.
"""

from __future__ import annotations

import sys
import time

from ..client.record import answer
from ..protocol import FlowView, LiveAnswer
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


def render(live: LiveAnswer | None, url: str, flow: FlowView | None = None) -> str:
    """The text view of one live answer and the node's flow (its strings escaped when printed:
    ``terminal.printable``)."""
    if live is None or live.median is None or live.worst is None:
        return f"{url}: no live window with traffic yet (live fitness reads every window of traffic)\n" + flow_lines(flow)
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
    d = live.drafter
    if d is not None:
        lines.append(
            f"  drafter   layers {list(d.layers)}  median {_num(d.median)}  worst {_num(d.worst)}  "
            f"({_share(d.share)} of the window's assignments: apart from the scores above)"
        )
    return "\n".join(lines) + "\n" + flow_lines(flow)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def flow_lines(flow: FlowView | None) -> str:
    """The node's flow: what it supplies (P) and what it waits for (D), over its last engine steps."""
    if flow is None:
        return "  flow      not measured (vLLM's stats are off, or this engine's adapter does not read them)"
    ftt = "n/a" if flow.first_token_ms is None else f"{flow.first_token_ms:.1f} ms"
    busy = "n/a (time_moe off)" if flow.busy_share is None else _share(flow.busy_share)
    return "\n".join(
        (
            f"  supply    {flow.prefill_completions_per_s:.2f} prefills/s  {flow.prefilled_tokens_per_s:.0f} prompt tok/s  "
            f"{flow.generated_tokens_per_s:.1f} gen tok/s  busy {busy}  (last {flow.window_s:.0f} s, {flow.steps} steps)",
            f"  demand    waiting {flow.waiting_mean:.1f}  running {flow.running_mean:.1f} of {flow.max_num_seqs} "
            f"({_share(flow.batch_share)})  KV pulls {flow.kv_fetching_mean:.1f}  first token {ftt}  "
            f"short of work {_share(flow.short_steps_share)} of steps",
        )
    )


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
        status = answer(args.url, "status", args.api_key, timeout=30)
        live, flow = status.live, status.flow
        text = render(live, args.url, flow)
        if args.once or console.json:
            console.emit({**(live.to_wire() if live else {}), "flow": None if flow is None else flow.to_wire()}, text)
        else:
            sys.stdout.write("\x1b[H\x1b[2J" + printable(text, lines=True))
            sys.stdout.write(f"\n\n  (every {args.interval:g} s; Ctrl-C stops)\n")
            sys.stdout.flush()
        refreshes += 1
        if args.once or (args.count and refreshes >= args.count):
            break
        time.sleep(args.interval)
    if live and live.drift:
        raise SystemExit(1)
