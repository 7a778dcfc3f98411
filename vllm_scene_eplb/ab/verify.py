"""The acceptance checks of ``deploy/ascend-910c/verify.sh``, one PASS/FAIL line each.

    python -m vllm_scene_eplb.ab.verify totals COUNTS BEFORE AFTER [--decode] [--local-prompt] [--spec-tokens K] [--model DIR]
    python -m vllm_scene_eplb.ab.verify native COUNTS NATIVE.json [--tolerance 0.02] [--waive-unavailable]
    python -m vllm_scene_eplb.ab.verify graph SERVER.log [--from-byte N] [--to-byte M]
    python -m vllm_scene_eplb.ab.verify comm SERVER.log [--want MC2]
    python -m vllm_scene_eplb.ab.verify throughput --plain P1.json P2.json ... --idle I1.json ... [--min-ratio 0.98]

``totals``: every MoE layer of a dump counted the tokens the engine itself ran while recording,
times top-k, from its own counters on two ``/metrics`` pages (``engine_tokens``): its prompt tokens
and, with ``--decode``, one token per decode pass; with ``--local-prompt`` only the prompt tokens it
computed itself, as on a D node whose prompts' KV was pulled from P (it computes the last prompt
token alone). With ``--spec-tokens K`` (an MTP drafter) a decode pass's verified drafts count too,
and the total is a range, up to 2K tokens a request the counters cannot see, with every layer the
same; the drafter's own rows are checked apart. Exact without a drafter. With ``--model`` (the
served model's folder) the layers checked are every MoE layer of the model's config, not those the
dump names: a layer that recorded nothing fails the check by name, DeepSeek-V4's hash-routed layers
said apart (SGLang #25961: a recorder that misses V4-Flash's 3 token-id-routed layers records 40 of
43). Holds when nothing but the recorded load ran and prefix caching is off. ``native``: the dump against vLLM-Ascend's own
``moe_load`` counters over the same record (``scene-eplb record native_load --json``): never above
them for any (layer, expert), and each layer's expert shares within ``tolerance`` (half the L1
distance); vLLM-Ascend also counts padding and idle-DP dummy rows, so they are not equal. Where
those counters do not exist it FAILs, unless ``--waive-unavailable`` (the operator's explicit
waiver, a SKIP line). ``graph``: the server's log (started with ``--cudagraph-metrics``) shows,
in the record's window of it (``--from-byte`` / ``--to-byte``: the log's size at the record's start
and after its stop, so warm-up and capture tables are left out), passes replayed through a captured
graph (runtime mode FULL or PIECEWISE) with padding rows, so the record's totals were checked
against padded batches; rows are read as vLLM 0.23 logs them, each behind the logger's prefix. ``comm``: the plugin's log line
(``protocol.COMM_METHOD_LINE``) shows the real passes ran MoE comm method ``--want`` and no other.
``throughput``: prefill throughput with the
plugin on and the recorder idle over the same load with the flag off, in rounds (the i-th
``--idle`` and ``--plain`` result ran in round i, a restart each; single runs vary by 15% and more,
so verify.sh runs 3 rounds): the geometric mean of the within-round ratios with a 95% t interval
over rounds (``vllm_scene_eplb.ab.stats``, the factorial A/B's statistics); it passes when the ratio
reaches ``--min-ratio``, and the line says whether the interval could tell (never under 3 rounds). Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import SceneEplbError
from ..formats import read_counts
from ..layouts.drafter import drafter_layers_of
from ..planning.model_files import read_model
from ..planning.model_geometry import ModelGeometry
from ..protocol import COMM_METHOD_RE
from .engine_tokens import PROMPT_TOKENS, EngineTokens, counter, engine_tokens
from .results import NOT_OBSERVED, read_result
from .stats import MIN_ROUNDS, block_effects, check_positive


@dataclass(frozen=True)
class Verdict:
    name: str
    ok: bool
    detail: str
    skipped: bool = False

    def line(self) -> str:
        return f"{'SKIP' if self.skipped else 'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def prompt_tokens(metrics_text: str) -> int:
    """``vllm:prompt_tokens_total`` summed over every series (one per DP engine) of a /metrics page."""
    return counter(metrics_text, PROMPT_TOKENS)


def _silent_layers(per_layer: np.ndarray, model: ModelGeometry) -> str:
    """The model's MoE layers that recorded nothing (the dump's layer axis is the model's layer
    index), said with the hash-routed ones apart; empty when every one recorded tokens."""
    silent = [layer for layer in model.moe_layers if layer >= len(per_layer) or per_layer[layer] == 0]
    if not silent:
        return ""
    hashed = [layer for layer in silent if layer in model.hash_layers]
    return f"; {len(model.moe_layers) - len(silent)} of {len(model.moe_layers)} MoE layers recorded tokens, none in {silent}" + (
        f" (hash-routed by token id: {hashed})" if hashed else ""
    )


def totals(
    counts_path: str,
    before: str,
    after: str,
    decode: bool = False,
    local_prompt: bool = False,
    model: str | None = None,
    spec_tokens: int = 0,
) -> Verdict:
    """Every MoE layer's recorded total equals the engine's tokens x top-k (``engine_tokens``: exact,
    or with a drafter of ``spec_tokens`` between its floor and ceiling, every layer the same); with
    ``model`` every MoE layer of that model's config, each of which must have recorded tokens. The
    drafter's rows are checked apart (``_drafter_rows``)."""
    counts = read_counts(counts_path)
    top_k = counts.meta.get("top_k")
    if not isinstance(top_k, int) or top_k < 1:
        raise SceneEplbError("the dump carries no top_k: not a dump of this plugin's recorder", counts_path)
    engine = engine_tokens(Path(before).read_text(), Path(after).read_text(), decode, local_prompt, spec_tokens)
    all_layers = counts.data.sum(axis=(0, 2))
    geometry = read_model(model).geometry if model is not None else None
    if geometry is not None:
        layers, silent = list(geometry.moe_layers), _silent_layers(all_layers, geometry)
    else:
        layers, silent = [int(x) for x in counts.meta.get("moe_layers") or np.flatnonzero(all_layers)], ""
    per_layer = [int(all_layers[layer]) if layer < len(all_layers) else 0 for layer in layers]
    low, high = engine.floor * top_k, (engine.floor + engine.slack) * top_k
    if engine.slack:  # a range: every layer ran the same rows, a whole number of tokens within it
        wrong = [(lay, t) for lay, t in zip(layers, per_layer) if t != per_layer[0] or t % top_k or not low <= t <= high]
        expected = f"within [{low}, {high}], the same each (measured {per_layer[0] if per_layer else 0})"
    else:
        wrong = [(layer, t) for layer, t in zip(layers, per_layer) if t != low]
        expected = f"{low} each"
    drafter_ok, drafter = _drafter_rows(counts, all_layers, engine, spec_tokens, top_k)
    detail = (
        f"{len(layers)} MoE layers x {engine.what} x top-k {top_k} = {expected}"
        + (f"; off: {wrong[:5]}{' ...' if len(wrong) > 5 else ''}" if wrong else "")
        + silent
        + drafter
    )
    name = "per-layer totals = (prompt + decode) tokens x top-k" if decode else "per-layer totals = prompt tokens x top-k"
    return Verdict(name, bool(layers) and engine.floor > 0 and not wrong and drafter_ok, detail)


def _drafter_rows(counts, all_layers: np.ndarray, engine: EngineTokens, spec_tokens: int, top_k: int) -> tuple[bool, str]:
    """The drafter's MoE rows (``layouts.drafter``) against the passes that ran them, and what to say.
    A drafter forward runs the target pass's rows (the rejected drafts' rows left out where the drafter
    batch is not padded), then K - 1 more of one row a request: between the target's floor less its
    rejected drafts and K x its ceiling. Rows without a drafter, or a silent row, fail; no rows with
    a drafter is said (a recorder that does not count the drafter)."""
    rows = drafter_layers_of(counts)
    if not rows:
        return True, "; the drafter's rows: none in the dump (not counted)" if spec_tokens else ""
    if not spec_tokens:
        return False, f"; drafter rows {list(rows)} in the dump, yet no speculative tokens given (--spec-tokens)"
    low, high = (engine.floor - engine.rejected) * top_k, spec_tokens * (engine.floor + engine.slack) * top_k
    off = [(row, int(all_layers[row])) for row in rows if not low <= int(all_layers[row]) <= high or not all_layers[row]]
    said = f"; the drafter's rows {list(rows)} within [{low}, {high}] apart" + (f", off: {off}" if off else "")
    return not off, said


def native(counts_path: str, native_path: str, tolerance: float, waive_unavailable: bool = False) -> Verdict:
    """The dump against vLLM-Ascend's own counters over the same record (see the module docstring)."""
    name = "dump vs vLLM-Ascend's moe_load"
    try:
        answer = json.loads(Path(native_path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SceneEplbError(f"cannot read the native_load answer: {exc}", native_path) from None
    if not answer.get("available"):
        if waive_unavailable:
            return Verdict(name, True, f"{answer.get('reason')} (waived by the operator)", skipped=True)
        return Verdict(name, False, f"{answer.get('reason')}: nothing to check against (NATIVE_WAIVER=1 waives it)")
    counts = read_counts(counts_path)
    layers = [int(x) for x in answer["moe_layers"]]
    ours = counts.data.sum(axis=0)[layers].astype(np.int64)
    theirs = np.asarray(answer["counts"], dtype=np.int64)
    if theirs.shape != ours.shape:
        raise SceneEplbError(
            f"native counts have shape {list(theirs.shape)}, the dump's MoE layers {list(ours.shape)}", native_path
        )
    above = int((ours > theirs).sum())
    shares = [0.5 * np.abs(o / max(o.sum(), 1) - t / max(t.sum(), 1)).sum() for o, t in zip(ours, theirs)]
    worst = int(np.argmax(shares))
    detail = (
        f"ours / theirs {ours.sum() / max(theirs.sum(), 1):.4f} over {len(layers)} MoE layers; (layer, expert) pairs "
        f"above theirs: {above}; worst share distance {shares[worst]:.4f} (layer {layers[worst]}; pass at <= {tolerance})"
    )
    return Verdict(name, above == 0 and shares[worst] <= tolerance, detail)


# One row of vLLM's CUDAGraph Stats table (``CUDAGraphLogging``): unpadded, padded, paddings, mode, count;
# vLLM 0.23's log formatter repeats the first line's prefix ("(APIServer pid=N) INFO <time> [file:line] ")
# before every line of a message, so a row may stand behind one (anything up to "] " without a "|").
_GRAPH_ROW = re.compile(r"^(?:[^|\n]*\] )?\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\w.]+)\s*\|\s*(\d+)\s*\|\s*$", re.M)


def graph(log_path: str, start: int = 0, stop: int | None = None) -> Verdict:
    """Passes replayed through captured graphs, with padding rows, in bytes ``start`` to ``stop`` of
    the server's log (the record's window; vLLM's ``--cudagraph-metrics`` tables: one row per
    (unpadded, padded, mode) with its count)."""
    text = _read_log(log_path, start, stop)
    rows = [(int(u), int(p), int(n), mode, int(c)) for u, p, n, mode, c in _GRAPH_ROW.findall(text)]
    replayed = [r for r in rows if "FULL" in r[3] or "PIECEWISE" in r[3]]
    padded = sum(r[4] for r in replayed if r[2] > 0)
    name = "passes replayed through captured graphs, with padding rows"
    if not rows:
        return Verdict(
            name,
            False,
            f"no CUDAGraph Stats table in bytes {start}-{stop or 'end'} of the log (the record's window): "
            "start the server with --cudagraph-metrics",
        )
    detail = (
        f"{sum(r[4] for r in replayed)} graph passes ({padded} padded) of {sum(r[4] for r in rows)} in the log's "
        f"tables; modes {sorted({r[3] for r in rows})}"
    )
    if not replayed:
        return Verdict(name, False, detail + ": no pass replayed a graph")
    return Verdict(name, padded > 0, detail + ("" if padded else ": no padded replay (raise the concurrency)"))


def comm(log_path: str, want: str) -> Verdict:
    """The real passes in the server's log ran MoE comm method ``want`` and no other."""
    seen = sorted(set(COMM_METHOD_RE.findall(_read_log(log_path))))
    ok = seen == [want]
    detail = f"real passes ran {', '.join(seen) if seen else 'no MoE comm method the plugin logged'}"
    return Verdict(f"MoE comm method {want} chosen", ok, detail + ("" if ok else f", {want} alone expected"))


def _read_log(path: str, start: int = 0, stop: int | None = None) -> str:
    """Bytes ``start`` to ``stop`` (None: the end) of a server log, as text."""
    try:
        with Path(path).open("rb") as f:
            f.seek(start)
            return f.read(None if stop is None else max(stop - start, 0)).decode(errors="replace")
    except OSError as exc:
        raise SceneEplbError(f"cannot read the server log: {exc}", path) from None


THROUGHPUTS = ("prefill_throughput_per_card", "output_throughput_per_card")


def _throughputs(paths: list[str], metric: str) -> list[float]:
    """Each result's mean ``metric``, refused in one line where it is missing or not a positive number."""
    values = []
    for path in paths:
        mean = read_result(path)["aggregate"][metric]["mean"]
        if mean in (NOT_OBSERVED, None):
            raise SceneEplbError(f"no {metric} in this result", path)
        check_positive([mean], f"{path}: {metric}")
        values.append(float(mean))
    return values


def throughput(plain: list[str], idle: list[str], min_ratio: float, metric: str = "prefill_throughput_per_card") -> Verdict:
    """Throughput (``metric``: prefill on a P node, output on a D node) with the recorder idle over the
    flag off, on the same load, in rounds (``plain[i]`` and ``idle[i]`` ran in round i, a restart
    each): the geometric mean of the within-round ratios and its t interval over rounds
    (``stats.block_effects``); it passes at ``min_ratio``, and the line says whether the interval could tell."""
    if len(plain) != len(idle) or len(plain) < 2:
        raise SceneEplbError(f"{len(plain)} plain and {len(idle)} idle run(s): one of each per round, at least 2 rounds")
    sides = [np.asarray(_throughputs(paths, metric)) for paths in (plain, idle)]
    (eff,), _ = block_effects(np.log(np.stack(sides, axis=1)), [(-1.0, 1.0)])  # idle over plain, round by round
    lo, hi = eff.ci or (float("nan"), float("nan"))
    if eff.rounds < MIN_ROUNDS:
        reading = f"{eff.rounds} rounds cannot tell: rerun with ROUNDS >= {MIN_ROUNDS}"
    elif lo >= min_ratio:
        reading = "the interval lies above it"
    elif hi < min_ratio:
        reading = "the interval lies below it: a real cost"
    else:
        reading = "the interval spans it: rerun with more ROUNDS to tell"
    return Verdict(
        f"recorder idle vs flag off, {metric.split('_')[0]} throughput",
        eff.ratio >= min_ratio,
        f"{eff.ratio:.4f} [{lo:.4f}, {hi:.4f}] over {eff.rounds} rounds (idle {sides[1].mean():.1f} / off "
        f"{sides[0].mean():.1f} tok/s per card; pass at >= {min_ratio}; {reading})",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_scene_eplb.ab.verify",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="check", required=True)
    t = sub.add_parser("totals", help="per-layer totals of a dump against the engine's prompt-token counter")
    t.add_argument("counts"), t.add_argument("metrics_before"), t.add_argument("metrics_after")
    t.add_argument(
        "--decode",
        action="store_true",
        help="the load generated more than one token per request: count one token per decode pass too",
    )
    t.add_argument(
        "--local-prompt",
        action="store_true",
        help="count only the prompt tokens the engine computed itself (a D node that pulled the prompts' KV)",
    )
    t.add_argument(
        "--spec-tokens",
        type=int,
        default=0,
        metavar="K",
        help="the server's speculative tokens (MTP K): count the verified drafts, check the drafter's rows apart",
    )
    t.add_argument(
        "--model",
        metavar="DIR",
        help="the served model's folder: check every MoE layer of its config (each must have recorded tokens)",
    )
    n = sub.add_parser("native", help="a dump against vLLM-Ascend's own moe_load counters over the same record")
    n.add_argument("counts"), n.add_argument("native")
    n.add_argument(
        "--tolerance", type=float, default=0.02, help="largest per-layer expert-share distance that passes (default 0.02)"
    )
    n.add_argument(
        "--waive-unavailable", action="store_true", help="the operator's waiver: SKIP, not FAIL, where the counters do not exist"
    )
    g = sub.add_parser("graph", help="a server log (--cudagraph-metrics) shows padded passes replayed through graphs")
    g.add_argument("log")
    g.add_argument("--from-byte", type=int, default=0, help="where the record's window of the log starts (its size at start)")
    g.add_argument("--to-byte", type=int, default=None, help="where it ends (the log's size after the record's stop)")
    c = sub.add_parser("comm", help="a server log shows the real passes ran one MoE comm method")
    c.add_argument("log"), c.add_argument("--want", default="MC2", help="the comm method expected (default MC2)")
    p = sub.add_parser(
        "throughput", help="recorder idle vs flag off (scene-eplb bench results, one a side per round, >= 2 rounds)"
    )
    p.add_argument("--plain", nargs="+", required=True, help="bench results with the flag off, one per round")
    p.add_argument(
        "--idle",
        nargs="+",
        required=True,
        help="bench results with the plugin on, recorder idle, one per round (in the rounds' order)",
    )
    p.add_argument("--metric", choices=THROUGHPUTS, default=THROUGHPUTS[0], help="prefill (P node, default) or output (D node)")
    p.add_argument("--min-ratio", type=float, default=0.98, help="lowest idle/off throughput that passes (default 0.98)")
    args = parser.parse_args(argv)
    try:
        if args.check == "totals":
            verdict = totals(
                args.counts, args.metrics_before, args.metrics_after, args.decode, args.local_prompt, args.model, args.spec_tokens
            )
        elif args.check == "native":
            verdict = native(args.counts, args.native, args.tolerance, args.waive_unavailable)
        elif args.check == "graph":
            verdict = graph(args.log, args.from_byte, args.to_byte)
        elif args.check == "comm":
            verdict = comm(args.log, args.want)
        else:
            verdict = throughput(args.plain, args.idle, args.min_ratio, metric=args.metric)
    except SceneEplbError as exc:
        verdict = Verdict(args.check, False, str(exc))
    print(verdict.line())
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
