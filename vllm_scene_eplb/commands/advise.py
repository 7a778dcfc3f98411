"""`scene-eplb advise COUNTS --layout CANDIDATE`: will the candidate pay in time? trial | skip | insufficient_evidence."""

from __future__ import annotations

from ..advise import advise
from ..client.record import call
from ..dispatch import DISPATCH_ALGORITHMS
from ..errors import SceneEplbError
from ..fileio import load_json
from ..formats import read_counts, read_layout
from ..protocol import LIVE_KEY
from .common import Console, geometry_args, hint, memory_cost, model_args, server_args

HELP = "predict whether a candidate layout pays in throughput on a running server (trial | skip | insufficient_evidence)"
DESCRIPTION = (
    "From a dump recorded on the running server and its timing window (status live.time, with "
    "scene_eplb.time_moe on), fit per MoE layer rank MoE time against the assignments the rank computed, "
    "predict the slowest-rank MoE time per pass with the candidate layout and the throughput ratio to the "
    "running layout, and say trial, skip or insufficient_evidence with the reasons: the predicted gain against "
    "the noise floor, the gain on both halves of the recording, the MoE share of step time and, with --model, "
    "what the candidate's redundant slots cost in KV cache. Exit 0 for trial, 1 otherwise."
)


def add_arguments(p) -> None:
    p.add_argument("counts", help="a dump of the running server (native .npz with physical_count)")
    p.add_argument("--layout", required=True, help="the candidate layout")
    p.add_argument(
        "--dispatch",
        choices=DISPATCH_ALGORITHMS,
        default=None,
        help="the dispatch the candidate would run (default: what it was fitted for, else static)",
    )
    p.add_argument(
        "--timing", metavar="FILE", help="a saved status answer (or its live / live.time object) of the running server"
    )
    server_args(p, url_default=None, url_help="the running server: its status route's live.time (instead of --timing)")
    geometry_args(p)
    model_args(p)


def _timing(args) -> dict | None:
    """The ``live.time`` object from --timing FILE (a status answer, its live object or the time object) or --url."""
    if args.url and args.timing:
        raise SceneEplbError("give the timing as --timing FILE or --url URL, not both")
    if args.url:
        doc = call(args.url, "status", args.api_key, timeout=30)
    elif args.timing:
        doc = load_json(args.timing, "timing")
    else:
        return None
    if not isinstance(doc, dict):
        raise SceneEplbError(
            "timing must be a JSON object (a status answer, its live object or live.time)", args.timing or args.url
        )
    live = doc.get(LIVE_KEY, doc) or {}
    timing = live.get("time", live) if isinstance(live, dict) else None
    if timing is not None and not isinstance(timing, dict):
        raise SceneEplbError("timing's live.time must be an object", args.timing or args.url)
    return timing


def run(args, console: Console) -> None:
    counts = read_counts(args.counts)
    candidate = read_layout(args.layout, hint(args))
    dispatch = args.dispatch or candidate.meta.get("dispatch") or "static"
    memory = memory_cost(args, candidate.geometry)
    try:
        answer = advise(counts, candidate, dispatch, _timing(args), memory["summary"] if memory else None)
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, exc.path or args.layout) from None
    ratio = answer["predicted_throughput_ratio"]
    text = (
        f"verdict: {answer['verdict']}"
        + ("" if ratio is None else f"  (predicted throughput ratio {ratio:.3f})")
        + "".join(f"\n  - {r}" for r in answer["reasons"])
    )
    console.emit({**answer, "dispatch": dispatch, "memory": memory}, text)
    if answer["verdict"] != "trial":
        raise SystemExit(1)
