"""What the commands share: the console (``--json``, ``-q``), argument groups and the score summary."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..counts import Counts
from ..errors import SceneEplbError
from ..evaluation import SCORES, Evaluation, check_compatible
from ..formats import GeometryHint, read_counts
from ..layout import Geometry
from ..memory import KV_CACHE_DTYPES, cost_sentence, geometry_cost, read_model_memory, replica_cost
from ..scenes import normalise_weights
from ..terminal import printable
from .options import integer


@dataclass(frozen=True)
class Console:
    """Where a command speaks: the result on stdout (JSON with ``--json``), progress on stderr
    unless ``quiet``. Passed to every command, so nothing reads a module-level switch."""

    quiet: bool = False
    json: bool = False

    @contextmanager
    def progress(self, what: str):
        """Say on stderr what is running and how long it took (stdout stays clean for --json)."""
        start = time.perf_counter()
        self.say(f"scene-eplb: {what}...")
        yield
        self.say(f"scene-eplb: {what}: done in {time.perf_counter() - start:.2f}s")

    def say(self, message: str) -> None:
        if not self.quiet:
            print(printable(message, lines=True), file=sys.stderr, flush=True)

    def emit(self, payload: dict, text: str) -> None:
        """The result: ``payload`` as strict JSON with ``--json`` (see ``json_safe``), else ``text``
        with every control character escaped (a server's strings never act on the terminal)."""
        print(json.dumps(json_safe(payload), indent=2) if self.json else printable(text, lines=True))


NON_FINITE_KEY = "non_finite"


def json_safe(payload: dict) -> dict:
    """``payload`` with every NaN or infinite number made null, the note ``NON_FINITE_KEY`` listing
    where (JSON has no NaN: ``--json`` output stays JSON a strict parser reads)."""
    where: list[str] = []

    def clean(value, at: str):
        if isinstance(value, float) and not math.isfinite(value):
            where.append(f"{at}: {value}")
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{at}.{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{at}[{i}]") for i, v in enumerate(value)]
        return value

    out = clean(payload, "$")
    return {**out, NON_FINITE_KEY: where} if where and isinstance(out, dict) else out


def output_args(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``-q`` and ``--debug``, which every command takes."""
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--debug", action="store_true", help="on an internal error, print its traceback")


def geometry_args(parser: argparse.ArgumentParser) -> None:
    """The geometry a bare layout file (SGLang, vLLM-Ascend, .pt) cannot carry itself."""
    g = parser.add_argument_group("geometry of bare layout files (SGLang, vLLM-Ascend, .pt carry none or part of it)")
    g.add_argument("--ep-size", type=integer(1), help="expert-parallel ranks")
    g.add_argument("--num-experts", type=integer(1), help="logical experts (default: largest id + 1)")
    g.add_argument("--nodes", type=integer(1), help="nodes the EP ranks span (default 1)")


def hint(args: argparse.Namespace) -> GeometryHint:
    return GeometryHint(getattr(args, "ep_size", None), getattr(args, "num_experts", None), getattr(args, "nodes", None))


def server_args(
    parser: argparse.ArgumentParser,
    url_default: str | None = "http://localhost:8000",
    url_help: str | None = None,
    url_required: bool = False,
) -> None:
    """``--url`` and ``--api-key`` of a running server (the key defaults to $VLLM_API_KEY, as vLLM's own)."""
    if url_required:
        parser.add_argument("--url", required=True, help="server base URL")
    else:
        parser.add_argument("--url", default=url_default, help=url_help or f"server base URL (default {url_default})")
    parser.add_argument(
        "--api-key", default=os.environ.get("VLLM_API_KEY"), help="the server's --api-key (default: $VLLM_API_KEY)"
    )


def read_scenes(paths: list[str], console: Console, layout=None) -> list[Counts]:
    """Each counts file read and validated for fitting or scoring (some routing; given a layout, the
    layout's model shape), errors naming the file."""
    scenes = []
    for path in paths:
        with console.progress(f"reading {path}"):
            counts = read_counts(path)
        if not counts.data.any():
            raise SceneEplbError("every count is zero: nothing was routed (an empty record?), nothing to fit or score", path)
        if layout is not None:
            try:
                check_compatible(layout, counts)
            except SceneEplbError as exc:
                raise SceneEplbError(exc.problem, path) from None
        scenes.append(counts)
    return scenes


def summary_text(ev: Evaluation) -> str:
    """The score summary every scoring command prints: median and worst layer of each score."""
    s = ev.summary()
    out = [f"layout {s['layout_hash']}  fingerprint {s['fingerprint'] or '-'}  MoE layers {s['layers']}"]
    for score in SCORES:
        st = s[score.key]
        out.append(
            f"  {score.key:22s} " + ("NOT_OBSERVED" if st is None else f"median {st['median']:.4f}  worst {st['worst']:.4f}")
        )
    return "\n".join(out)


def model_args(parser: argparse.ArgumentParser) -> None:
    """``--model`` and how to price its memory."""
    g = parser.add_argument_group("model (a Hugging Face model folder: config.json and its quantisation config)")
    g.add_argument(
        "--model",
        metavar="DIR",
        help="the served model's folder: routing groups and top-k come from it, and "
        "the output says what the redundant slots cost in memory and KV cache",
    )
    g.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default="auto",
        help="the server's --kv-cache-dtype, to price a KV token (default auto: the model's dtype)",
    )
    g.add_argument(
        "--expert-bytes",
        type=integer(1, 1 << 50),
        metavar="N",
        help="bytes of one routed expert in one layer, when the checkpoint's quantisation is not one this tool prices",
    )


def memory_cost(args: argparse.Namespace, geometry: Geometry | None) -> dict | None:
    """The ``memory`` object (``memory.replica_cost``, with its sentence) when ``--model`` was given:
    for the geometry's redundant slots, or per redundant slot per rank without a geometry."""
    if not getattr(args, "model", None):
        if getattr(args, "expert_bytes", None) is not None:
            raise SceneEplbError("--expert-bytes prices the experts of --model: give --model DIR too")
        return None
    memory = read_model_memory(args.model, args.kv_cache_dtype, args.expert_bytes)
    cost = geometry_cost(memory, geometry) if geometry else replica_cost(memory, 1.0)
    return {**cost, "summary": cost_sentence(cost, geometry)}


def dropped_table(layout, fmt: str, out) -> tuple[list[str], str]:
    """What a layout file of format ``fmt`` cannot hold of ``layout`` (the fitted static table in a
    bare format), for ``--json``'s ``dropped``, and the note that says so (empty when nothing is lost)."""
    if layout.static_sources is None or fmt == "native":
        return [], ""
    return ["static_sources"], (
        f"\nnote: {fmt} files cannot hold the fitted static table (static_sources): an engine "
        f"reading {out} alone uses its own replica choice; the scene_eplb plugin, given the "
        "native layout, uses the fitted table"
    )


def scene_names(paths: list[str]) -> list[str]:
    """A short, unique name per counts file (its stem; the path where stems repeat)."""
    stems = [Path(p).stem for p in paths]
    return [s if stems.count(s) == 1 else str(p) for s, p in zip(stems, paths)]


def scenes_payload(paths: list[str], evals: list[Evaluation], weights: list[float] | list[None] | None = None) -> dict:
    """The scores in ``--json``: ``summary`` and ``layers`` for one counts file; a ``scenes`` list
    (counts, name, weight, summary, layers) for several."""
    if len(evals) == 1:
        return {"summary": evals[0].summary(), "layers": evals[0].rows()}
    weights = weights or [None] * len(evals)
    return {
        "scenes": [
            {"counts": p, "name": n, "weight": w, "summary": ev.summary(), "layers": ev.rows()}
            for p, n, w, ev in zip(paths, scene_names(paths), weights, evals)
        ]
    }


def scenes_text(paths: list[str], evals: list[Evaluation]) -> str:
    """The score summary of each scene, named when there are several."""
    if len(evals) == 1:
        return summary_text(evals[0])
    return "\n".join(f"scene {n}:\n{summary_text(ev)}" for n, ev in zip(scene_names(paths), evals))


def parse_weights(text: str | None, scenes: int) -> list[float] | None:
    """'0.5,0.3,0.2' into one positive finite weight per scene, or a clear error."""
    if text is None:
        return None
    try:
        weights = [float(x) for x in text.split(",")]
    except ValueError:
        raise SceneEplbError(f"--scene-weights {text!r}: expected numbers separated by commas, e.g. 0.5,0.3,0.2") from None
    try:
        normalise_weights(weights, scenes)  # checked now, before any counts file is read
    except SceneEplbError as exc:
        raise SceneEplbError(f"--scene-weights {text!r}: {exc.problem}") from None
    return weights


@dataclass(frozen=True)
class Routing:
    """The model's routing groups and top-k as a command resolved them, and where they came from."""

    expert_groups: int
    top_k: int | None
    source: str  # "--expert-groups", "--model", "counts metadata" or "default"


def resolve_routing(args: argparse.Namespace, scenes: list) -> Routing:
    """Routing groups: ``--expert-groups`` wins, else ``--model``'s config (n_group), else what the
    recorder wrote into the counts (every scene must agree), else 1 (no groups)."""
    from ..model_geometry import read_model_geometry

    top_k = None
    if getattr(args, "model", None):
        model = read_model_geometry(args.model)
        if model.num_experts != scenes[0].num_experts:
            raise SceneEplbError(f"--model has {model.num_experts} experts, the counts {scenes[0].num_experts}", args.model)
        if args.expert_groups is None:
            return Routing(model.expert_groups, model.top_k, "--model")
        top_k = model.top_k
    recorded = {(c.meta.get("expert_groups"), c.meta.get("top_k")) for c in scenes}
    if len(recorded) > 1:
        raise SceneEplbError(f"the counts files record different routing (expert_groups, top_k): {sorted(recorded, key=str)}")
    groups, recorded_top_k = recorded.pop()
    top_k = top_k or recorded_top_k
    if args.expert_groups is not None:
        return Routing(args.expert_groups, top_k, "--expert-groups")
    if isinstance(groups, int) and groups >= 1:
        return Routing(groups, top_k, "counts metadata")
    return Routing(1, top_k, "default")
