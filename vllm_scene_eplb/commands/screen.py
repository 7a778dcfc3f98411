"""`scene-eplb screen --model DIR --role prefill|decode --input-len N --output-len N --cached-share F`: before recording a scene, the share of a step its routed experts take and the
most a better-balanced layout could give that node (``step_cost``)."""

from __future__ import annotations

from dataclasses import replace

from ..planning.model_files import read_model
from ..planning.step_cost import (
    DEFAULT_BATCH,
    DEFAULT_CHUNK,
    DEFAULT_EP,
    DEFAULT_SCORE,
    MACHINES,
    ROLES,
    PricedScene,
    read_step_model,
    screen,
)
from .arguments import model_arg, pricing_args
from .console import Console
from .options import integer, number

HELP = "before recording: the routed experts' share of a scene's step and the ceiling a layout could give (ceiling_ratio)"
DESCRIPTION = (
    "Prices one EP rank's step per new token from a DeepSeek-style MoE model's config.json: attention "
    "(MLA, or DeepSeek-V4's compressed sparse attention per layer's compress ratio: projections, and the "
    "work over the context a token attends to), dense layers or V4's hyper-connections, shared and "
    "routed experts and the rest, each as FLOPs and bytes read on a named machine's roofline. Says the "
    "routed experts' share of the step and ceiling_ratio, the step ratio a layout at --candidate-score "
    "(default 1, perfect) gives over one at --score (default 2, a scene-blind layout) if only the slowest "
    "rank's routed FLOPs scale with its score. Every assumption is named in the output. Arithmetic, "
    "not measured: a low ceiling says the scene is not worth recording; a high one is an upper bound."
)


def add_arguments(p) -> None:
    s = p.add_argument_group("the scene")
    model_arg(
        s,
        required=True,
        help="the model's folder or its config.json, e.g. data/models/deepseek-v3 or data/models/deepseek-v4-flash",
    )
    s.add_argument("--role", choices=ROLES, required=True, help="the node: prefill (P) or decode (D)")
    s.add_argument("--input-len", type=integer(1), required=True, metavar="N", help="prompt tokens per request")
    s.add_argument("--output-len", type=integer(1), required=True, metavar="N", help="output tokens per request")
    s.add_argument(
        "--cached-share",
        type=number(0.0, 1.0, high_open=True),
        required=True,
        metavar="F",
        help="prefix-cache hits over the prompt, in [0, 1): attended to but not recomputed on prefill",
    )
    s.add_argument(
        "--chunk", type=integer(1), default=DEFAULT_CHUNK, metavar="N", help=f"prefill chunk in tokens (default {DEFAULT_CHUNK})"
    )
    s.add_argument(
        "--batch",
        type=integer(1),
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"decode sequences per rank per step (default {DEFAULT_BATCH})",
    )
    s.add_argument(
        "--ep-size", type=integer(1), default=DEFAULT_EP, metavar="N", help=f"the node's EP ranks (default {DEFAULT_EP})"
    )
    pricing_args(s)
    b = p.add_argument_group("the layouts (ideal scores: max / mean rank load, as `scene-eplb score` prints)")
    b.add_argument(
        "--score",
        type=number(1.0, float(1 << 16)),
        metavar="B0",
        help=f"the running layout's score on the scene (default {DEFAULT_SCORE:g}: a scene-blind layout)",
    )
    b.add_argument(
        "--candidate-score",
        type=number(1.0, float(1 << 16)),
        default=1.0,
        metavar="B1",
        help="the candidate layout's score (default 1: a perfect layout, the ceiling)",
    )
    m = p.add_argument_group("the machine (one rank's device, on the roofline)")
    m.add_argument("--machine", choices=sorted(MACHINES), default="910c", help="preset peak FLOP/s and bandwidth (default 910c)")
    m.add_argument("--peak-tflops", type=number(0.0, 1e6, low_open=True), metavar="T", help="override the preset's peak TFLOP/s")
    m.add_argument("--hbm-tbps", type=number(0.0, 1e6, low_open=True), metavar="T", help="override the preset's memory TB/s")


def run(args, console: Console) -> None:
    model = read_step_model(read_model(args.model), args.kv_cache_dtype, args.expert_bytes)
    scene = PricedScene(args.role, args.input_len, args.output_len, args.cached_share, args.chunk, args.batch, args.ep_size)
    machine = MACHINES[args.machine]
    if args.peak_tflops is not None or args.hbm_tbps is not None:
        machine = replace(
            machine,
            name=f"{machine.name} (overridden)",
            peak_flops=machine.peak_flops if args.peak_tflops is None else args.peak_tflops * 1e12,
            bytes_per_s=machine.bytes_per_s if args.hbm_tbps is None else args.hbm_tbps * 1e12,
            source=f"{machine.source}; overridden by --peak-tflops / --hbm-tbps",
        )
    answer = screen(model, scene, machine, args.score, args.candidate_score)
    rows = "".join(f"\n  {p.name:<22} {p.time_us:10.2f} us/token  {p.share:6.1%}  ({p.bound}-bound)" for p in answer.parts)
    text = (
        f"screen {scene.role}, input {scene.input_len:,} ({scene.cached_tokens:,} cached), output {scene.output_len:,}, "
        f"mean context {scene.mean_context:,.0f}, on {machine.name}:{rows}\n"
        f"routed experts: {answer.routed_share:.1%} of the step at score {answer.score:g} "
        f"({answer.routed_share_perfect:.1%} at score 1)\n"
        f"ceiling_ratio {answer.ceiling_ratio:.4f}: the step ratio of a layout at score {answer.candidate_score:g} "
        f"over one at {answer.score:g}, if nothing else on the critical path moves\n"
        "assumptions:" + "".join(f"\n  - {a}" for a in answer.assumptions)
    )
    console.emit({"model": args.model, **answer.to_dict()}, text)
