"""`scene-eplb pair-advise`: what a P layout, a D layout or both do to the whole P/D pair's output
throughput under a measured load, with its interval, and which side binds."""

from __future__ import annotations

from ..advise.pair import (
    DEFAULT_DRAWS,
    DEFAULT_ELASTICITY,
    MAX_DRAWS,
    MIN_DRAWS,
    NodeEffect,
    NodeWindow,
    pair_advise,
)
from ..client.record import answer
from ..errors import SceneEplbError
from ..fileio import load_json
from ..protocol import Advice, StatusAnswer
from .arguments import server_args
from .console import Console
from .options import integer, number

HELP = "predict the P/D pair's output throughput ratio of a P layout, a D layout or both, and say which side binds"
DESCRIPTION = (
    "From the P node's and the D node's status (--p-node, --d-node: a server URL or a saved status answer, "
    "taken while the bench ran; each needs its flow, and P its busy share: scene_eplb.time_moe), vllm bench "
    "serve's detailed result of the pair's load (--bench: --save-result --save-detailed; a fixed concurrency "
    "is a closed loop, a request rate an open one) and each candidate's node ratio (--p-advice / --d-advice: "
    "a node's `scene-eplb advise --json`; or --p-step-ratio / --d-step-ratio: old step time over new, > 1 "
    "faster, with an optional interval), model the pair as a closed network (P's prefill, the KV handoff, "
    "D's batched decode, the clients' own time) and predict the pair's output throughput ratio of each "
    "layout with its interval, and which side binds (P busy and D starved; D full and P idle; the handoff). "
    "The model and its assumptions: docs/live-fitness.md, 'The P/D pair'. Exit 0 when a layout's interval "
    "clears the 2% noise floor (trial), 1 for skip or insufficient_evidence, 2 for invalid input."
)


def add_arguments(p) -> None:
    p.add_argument("--p-node", required=True, metavar="URL|FILE", help="the P node: its URL, or its saved status answer")
    p.add_argument("--d-node", required=True, metavar="URL|FILE", help="the D node: its URL, or its saved status answer")
    p.add_argument(
        "--bench", required=True, metavar="FILE", help="vllm bench serve's result of the pair (--save-result --save-detailed)"
    )
    for side in ("p", "d"):
        g = p.add_argument_group(f"the candidate on {side.upper()} (one of --{side}-advice or --{side}-step-ratio)")
        choice = g.add_mutually_exclusive_group()
        choice.add_argument(
            f"--{side}-advice", metavar="FILE", help=f"`scene-eplb advise --json` of the {side.upper()} node's candidate"
        )
        choice.add_argument(
            f"--{side}-step-ratio",
            type=number(0, low_open=True),
            metavar="R",
            help=f"the {side.upper()} node's step time now over with the candidate (a finite number > 0; > 1 faster)",
        )
        g.add_argument(
            f"--{side}-interval",
            nargs=2,
            type=number(0, low_open=True),
            metavar=("LOW", "HIGH"),
            help=f"the interval of --{side}-step-ratio, two finite numbers > 0 around it (default: the ratio alone)",
        )
    p.add_argument(
        "--elasticity",
        type=number(0, 1),
        default=DEFAULT_ELASTICITY,
        help="the most D's step time may rise with its batch, in [0, 1] (0: flat, memory-bound; 1: proportional); the "
        f"interval spans 0 to it (default {DEFAULT_ELASTICITY})",
    )
    p.add_argument(
        "--draws",
        type=integer(MIN_DRAWS, MAX_DRAWS),
        default=DEFAULT_DRAWS,
        help=f"draws for the interval, {MIN_DRAWS} to {MAX_DRAWS} ({MIN_DRAWS}: a draw, on average, beyond each end of "
        f"its 95%% interval; default {DEFAULT_DRAWS})",
    )
    p.add_argument("--seed", type=integer(0, 2**32 - 1), default=0, help="the draws' seed, 0 to 2^32 - 1 (default 0)")
    server_args(p, url=False)


def _window(where: str, api_key: str | None, side: str) -> NodeWindow:
    """A node's window from its URL or its saved status answer, checked."""
    if where.startswith(("http://", "https://")):
        status = answer(where, "status", api_key, timeout=30)
    else:
        status = StatusAnswer.from_wire(load_json(where, f"the {side} node's status"), where)
    return NodeWindow.of(status, side, where)


def _effect(args, side: str, node: NodeWindow) -> NodeEffect | None:
    advice, ratio, interval = (getattr(args, f"{side}_{k}") for k in ("advice", "step_ratio", "interval"))
    flag = f"--{side}-step-ratio"
    if interval is not None and ratio is None:
        raise SceneEplbError(f"--{side}-interval is the interval of {flag}: give {flag} too")
    if advice:
        return NodeEffect.of_advice(Advice.from_wire(load_json(advice, "advice"), advice), advice)
    if ratio is None:
        return None
    low, high = interval or (ratio, ratio)
    if not low <= ratio <= high:
        raise SceneEplbError(f"--{side}-interval [{low:g}, {high:g}] does not hold {flag} {ratio:g}")
    return NodeEffect.of_step_ratio(ratio, low, high, node, flag)


def run(args, console: Console) -> None:
    from ..ab.results import read_vllm_result

    p, d = _window(args.p_node, args.api_key, "P"), _window(args.d_node, args.api_key, "D")
    load = read_vllm_result(args.bench)
    p_effect, d_effect = _effect(args, "p", p), _effect(args, "d", d)
    if p_effect is None and d_effect is None:
        raise SceneEplbError("no candidate to price: give --p-advice or --p-step-ratio, and/or --d-advice or --d-step-ratio")
    result = pair_advise(p, d, load, p_effect, d_effect, args.elasticity, args.draws, args.seed)
    text = (
        f"verdict: {result.verdict}  ({result.load} loop; binding: {result.binding or 'not said'})"
        + "".join(f"\n  - {r}" for r in result.reasons)
        + "\nassumptions:"
        + "".join(f"\n  - {a}" for a in result.assumptions)
    )
    sources = {"p": None if p_effect is None else p_effect.source, "d": None if d_effect is None else d_effect.source}
    console.emit({**result.to_wire(), "node_ratio_sources": sources}, text)
    if result.verdict != "trial":
        raise SystemExit(1)
