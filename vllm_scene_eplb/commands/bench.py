"""`scene-eplb bench`: one named scene against a server through vLLM's own `vllm bench serve`."""

from __future__ import annotations

from pathlib import Path

from .arguments import server_args
from .console import Console
from .options import check_output_file, integer, number

HELP = "run a named scene against a server through vLLM's `vllm bench serve`"
DESCRIPTION = (
    "Drive an OpenAI-compatible server with vLLM's own benchmark (random dataset, fixed lengths) and save "
    "per-card throughput (whole run and steady state), TTFT/TPOT percentiles and the scene manifest (with the "
    "server's status route) to one JSON file. Needs vLLM installed."
)
SHOWN = ("output_throughput_per_card", "prefill_throughput_per_card", "output_throughput_per_card_steady", "ttft_p99_ms")


def add_arguments(p) -> None:
    server_args(p)
    p.add_argument(
        "--served-model-name",
        required=True,
        metavar="NAME",
        help="the model as the server serves it (its /v1/models id; vLLM's default: the path it was started with)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="where the prompts' tokenizer loads from (default: the path the server loaded NAME from, its /v1/models root)",
    )
    p.add_argument("--scene", required=True, help="scene name, saved in the manifest")
    p.add_argument("-n", "--num-prompts", type=integer(1), required=True, help="request count N")
    p.add_argument("-c", "--concurrency", type=integer(1), required=True, help="max concurrent requests C")
    p.add_argument(
        "-r",
        "--request-rate",
        type=number(0, low_open=True, allow_inf=True),
        default=float("inf"),
        help="request rate r in req/s (default inf)",
    )
    p.add_argument("--input-len", type=integer(1), required=True)
    p.add_argument("--output-len", type=integer(1), required=True)
    p.add_argument(
        "--prefix-share",
        type=number(0, 1, high_open=True),
        default=0.0,
        help="share of each prompt that is a common prefix (cache scene)",
    )
    p.add_argument(
        "--cards",
        type=integer(1),
        help="all P + D cards: throughput per card divides by this (default: the "
        "server's own DP x TP ranks, from its status route; never fewer than those)",
    )
    p.add_argument("--repeats", type=integer(1, 1000), default=1, help="runs; >= 2 gives a mean and a 95%% confidence interval")
    p.add_argument("--seed", type=integer(0, 2**31 - 1), default=0)
    p.add_argument("--quantization", help="for the manifest (default NOT_OBSERVED)")
    p.add_argument("--chunk-size", type=integer(1), help="the server's chunked-prefill size, for the manifest")
    p.add_argument("--parallel", help="the server's parallel geometry, e.g. TP2-EP2, for the manifest")
    p.add_argument("-o", "--output", required=True, help="result JSON to write")


def run(args, console: Console) -> None:
    from ..ab.bench import bench
    from ..ab.results import BenchLoad

    check_output_file(args.output)
    scene = BenchLoad(
        args.scene,
        args.num_prompts,
        args.concurrency,
        args.request_rate,
        args.input_len,
        args.output_len,
        args.prefix_share,
        args.cards,
        args.seed,
    )
    extra = {"quantization": args.quantization, "chunk_size": args.chunk_size, "parallel": args.parallel}
    doc = bench(
        args.url, args.served_model_name, scene, Path(args.output), args.repeats, args.api_key, extra, console.say, args.tokenizer
    )
    agg = doc["aggregate"]
    lines = [f"wrote {args.output}  window {agg['window_s']} s  steady-state {agg['steady_state']}  failed {agg['failed']}"]
    for m in SHOWN:
        v = agg[m]
        lines.append(
            f"  {m:36s} {v['mean'] if isinstance(v['mean'], str) else format(v['mean'], '.2f')}"
            + (f" +- {v['ci95']:.2f}" if isinstance(v.get("ci95"), float) else "")
        )
    console.emit(doc, "\n".join(lines))
