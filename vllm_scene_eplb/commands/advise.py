"""`scene-eplb advise COUNTS --layout CANDIDATE`: will the candidate pay in time? trial | skip | insufficient_evidence."""

from __future__ import annotations

from ..advise import advise
from ..client.record import answer
from ..errors import SceneEplbError
from ..fileio import load_json
from ..formats import read_counts, read_layout
from ..layouts.dispatch import DISPATCH_ALGORITHMS
from ..planning.memory import memory_cost
from ..protocol import TimingWindow
from .arguments import check_layout_model, geometry_args, hint, model_args, model_memory, read_model_arg, server_args
from .console import Console
from .scenes import check_model_counts

HELP = "predict whether a candidate layout pays in throughput on a running server (trial | skip | insufficient_evidence)"
DESCRIPTION = (
    "From a dump recorded on the running server and its timing window (status live.time, with "
    "scene_eplb.time_moe on), fit per MoE layer rank MoE time against the assignments the rank computed, "
    "predict the expected slowest-rank MoE time per pass under the running layout and the candidate (both "
    "modelled from the logical counts through their dispatch), and say trial, skip or insufficient_evidence "
    "with the reasons: the predicted gain against the measured noise floor, the gain on both halves of the "
    "recording, whether the running layout's model matches what was measured, whether the timing window "
    "comes from the dump's server and setup, the MoE share of step time and, with --model, what the "
    "candidate's redundant slots cost in KV cache. Exit 0 for trial, 1 for skip or insufficient_evidence, "
    "2 for invalid input."
)


def add_arguments(p) -> None:
    p.add_argument("counts", help="a dump of the running server (scene-eplb .npz with physical_count)")
    p.add_argument("--layout", required=True, help="the candidate layout")
    p.add_argument(
        "--dispatch",
        choices=DISPATCH_ALGORITHMS,
        default=None,
        help="the dispatch the candidate would run (default: what it was fitted for, else static)",
    )
    p.add_argument(
        "--running",
        metavar="LAYOUT",
        help="the layout the running server loaded (its hash must be the dump's layout_hash; not needed on the linear layout)",
    )
    p.add_argument(
        "--timing", metavar="FILE", help="a saved status answer (or its live / live.time object) of the running server"
    )
    p.add_argument(
        "--noise-ab",
        nargs=2,
        metavar=("A.json", "B.json"),
        help="two bench results of identical setups: their throughput ratio raises the noise floor (default: measured "
        "from the timing window's sub-windows, at least 2%%)",
    )
    server_args(p, url_default=None, url_help="the running server: its status route's live.time (instead of --timing)")
    geometry_args(p)
    model_args(p)


def _timing(args, layers: int) -> TimingWindow | None:
    """The timing window from --timing FILE (a status answer, its live object or the time object) or
    --url, checked (``TimingWindow.from_status``)."""
    if args.url and args.timing:
        raise SceneEplbError("give the timing window as --timing FILE or --url URL, not both")
    if args.url:
        return TimingWindow.of_status(answer(args.url, "status", args.api_key, timeout=30), args.url, layers)
    if args.timing:
        return TimingWindow.from_status(load_json(args.timing, "timing"), args.timing, layers)
    return None


def _ab_ratio(paths: list[str] | None, role: str | None) -> float | None:
    """The primary throughput ratio B / A of two bench results of identical setups."""
    if not paths:
        return None
    from ..ab.results import read_result

    metric = "prefill_throughput_per_card" if role == "prefill" else "output_throughput_per_card"
    values = []
    for path in paths:
        mean = read_result(path)["aggregate"][metric]["mean"]
        if not isinstance(mean, (int, float)) or mean <= 0:
            raise SceneEplbError(f"the bench result has no positive {metric} mean", path)
        values.append(float(mean))
    return values[1] / values[0]


def _check_candidate(args, candidate, dispatch: str) -> None:
    """The candidate's dispatch a known one."""
    if dispatch not in DISPATCH_ALGORITHMS:
        raise SceneEplbError(
            f"the candidate's meta.dispatch is {dispatch!r}, not one of {', '.join(DISPATCH_ALGORITHMS)}", args.layout
        )


def run(args, console: Console) -> None:
    model = read_model_arg(args)
    counts = read_counts(args.counts)
    candidate = read_layout(args.layout, hint(args))
    dispatch = args.dispatch or candidate.meta.get("dispatch") or "static"
    _check_candidate(args, candidate, dispatch)
    if model is not None:  # the dump and the candidate both of --model (as ``validate`` checks a layout)
        check_model_counts(model, counts, args.counts)
        check_layout_model(candidate, model, args.layout, candidate.geometry.ep_size)
    running = read_layout(args.running, hint(args)) if args.running else None
    timing = _timing(args, len(candidate.moe_layers))
    ab = _ab_ratio(args.noise_ab, counts.meta.get("role"))
    memory = memory_cost(model_memory(args, model), candidate.geometry)
    answer = advise(counts, candidate, dispatch, timing, memory["summary"] if memory else None, running, ab)
    ratio = answer.predicted_throughput_ratio
    text = (
        f"verdict: {answer.verdict}"
        + ("" if ratio is None else f"  (predicted throughput ratio {ratio:.3f})")
        + "".join(f"\n  - {r}" for r in answer.reasons)
    )
    console.emit({**answer.to_wire(), "dispatch": dispatch, "memory": memory}, text)
    if answer.verdict != "trial":
        raise SystemExit(1)
