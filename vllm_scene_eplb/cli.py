"""`scene-eplb`: inspect counts, fit, validate, score, convert and report layouts (pure CPU), and drive a
running server's recorder (`record`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import __version__
from .dispatch import DISPATCH_ALGORITHMS
from .errors import SceneEplbError
from .evaluation import evaluate
from .fileio import atomic_write_bytes
from .fit import FitOptions, fit
from .formats import COUNTS_FORMATS, LAYOUT_FORMATS, GeometryHint, file_kind, read_counts, read_layout, write_counts, write_layout
from .layout import Geometry, Layout
from .model_geometry import read_model_geometry

_quiet = False


@contextmanager
def progress(what: str):
    """Say on stderr what is running and how long it took (stdout stays clean for --json)."""
    start = time.perf_counter()
    if not _quiet:
        print(f"scene-eplb: {what}...", file=sys.stderr, flush=True)
    yield
    if not _quiet:
        print(f"scene-eplb: {what}: done in {time.perf_counter() - start:.2f}s", file=sys.stderr, flush=True)


def _emit(args, payload: dict, text: str) -> None:
    print(json.dumps(payload, indent=2) if args.json else text)


def _hint(args) -> GeometryHint:
    return GeometryHint(getattr(args, "ep_size", None), getattr(args, "num_experts", None), getattr(args, "nodes", None))


def _summary_text(ev) -> str:
    s = ev.summary()
    out = [f"layout {s['layout_hash']}  fingerprint {s['fingerprint'] or '-'}  MoE layers {s['layers']}"]
    for key in ("old_train", "new_train", "old_holdout", "new_holdout", "new_static_train", "new_per_slot_holdout"):
        st = s[key]
        out.append(f"  {key:22s} " + ("NOT_OBSERVED" if st is None else f"median {st['median']:.4f}  worst {st['worst']:.4f}"))
    return "\n".join(out)


def cmd_inspect(args) -> None:
    with progress(f"reading {args.counts}"):
        c = read_counts(args.counts)
    total = c.total()
    active = c.active_layers()
    per_layer = total.sum(axis=1)
    skew = [float(total[l].max() / total[l].mean()) for l in active]
    payload = {
        "file": args.counts,
        "shape": list(c.data.shape),
        "slots_written": int(c.written_slots().size),
        "active_layers": active.tolist(),
        "all_zero_layers": [int(i) for i in np.flatnonzero(per_layer == 0)],
        "assignments_per_layer": {"min": int(per_layer[active].min()) if active.size else 0, "max": int(per_layer.max())},
        "expert_skew_max_over_mean": {"median": float(np.median(skew)) if skew else None, "worst": max(skew) if skew else None},
        "meta": c.meta,
        "counts_sha256": c.digest(),
    }
    text = (
        f"{args.counts}: counts [T={c.num_slots}, L={c.num_layers}, E={c.num_experts}], "
        f"{payload['slots_written']} slot(s) written\n"
        f"  routed layers: {active.size} (all-zero: {payload['all_zero_layers'][:10]}{'...' if len(payload['all_zero_layers']) > 10 else ''})\n"
        f"  assignments per routed layer: {payload['assignments_per_layer']['min']}..{payload['assignments_per_layer']['max']}\n"
        + (f"  expert load max/mean: median {np.median(skew):.2f}, worst {max(skew):.2f}\n" if skew else "")
        + f"  sha256 {c.digest()}"
    )
    _emit(args, payload, text)


def cmd_fit(args) -> None:
    with progress(f"reading {args.counts}"):
        counts = read_counts(args.counts)
    geometry = Geometry(counts.num_experts, args.redundant, args.ep_size, args.nodes)
    options = FitOptions(geometry, dispatch=args.dispatch, robust=args.robust, expert_groups=args.expert_groups)
    with progress(f"fitting {counts.num_layers} layers"):
        layout = fit(counts, options)
        ev = evaluate(layout, counts)
    out = write_layout(layout, args.output, args.format)
    _emit(args, {"output": str(out), "format": args.format, "summary": ev.summary(), "layers": ev.rows()}, _summary_text(ev) + f"\nwrote {out} ({args.format})")


def cmd_validate(args) -> None:
    layout = read_layout(args.layout, _hint(args))
    checks = []
    if args.model:
        model = read_model_geometry(args.model)
        ep = args.ep_size or layout.geometry.ep_size
        try:
            layout.check_model(len(model.moe_layers), model.num_experts, ep, model.moe_layers, model.num_layers)
        except SceneEplbError as exc:
            raise SceneEplbError(exc.problem, args.layout) from None
        checks.append(f"matches model {args.model}: {len(model.moe_layers)} MoE layers, {model.num_experts} experts")
    g = layout.geometry
    payload = {"file": args.layout, "valid": True, "layout_hash": layout.digest(), "geometry": g.to_dict(), "moe_layers": list(layout.moe_layers), "meta": layout.meta, "checks": checks}
    text = (
        f"{args.layout}: valid layout {layout.digest()}: {layout.num_layers} layers ({len(layout.moe_layers)} MoE), "
        f"{g.num_experts} experts + {g.num_redundant} redundant, ep_size {g.ep_size}, {g.num_nodes} node(s)"
        + "".join(f"\n  {c}" for c in checks)
    )
    _emit(args, payload, text)


def cmd_score(args) -> None:
    layout = read_layout(args.layout, _hint(args))
    with progress(f"reading {args.counts}"):
        counts = read_counts(args.counts)
    try:
        ev = evaluate(layout, counts)
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, args.counts) from None
    _emit(args, {"summary": ev.summary(), "layers": ev.rows()}, _summary_text(ev))


def cmd_convert(args) -> None:
    kind = file_kind(args.input)
    if kind == "counts":
        if args.to not in COUNTS_FORMATS:
            raise SceneEplbError(f"counts convert to one of {', '.join(COUNTS_FORMATS)}, not {args.to!r}", args.input)
        with progress(f"reading {args.input}"):
            obj = read_counts(args.input)
        out = write_counts(obj, args.output, args.to)
    else:
        obj = read_layout(args.input, _hint(args))
        if args.moe_layers is not None:
            obj = Layout(obj.physical_to_logical_map, obj.geometry, _parse_layers(args.moe_layers, obj.num_layers), obj.meta)
        out = write_layout(obj, args.output, args.to)
    _emit(args, {"input": args.input, "kind": kind, "output": str(out), "format": args.to}, f"wrote {out} ({kind}, {args.to})")


def cmd_record(args) -> None:
    from .record_client import call

    result = call(args.url, args.action, args.api_key, args.timeout)
    if args.action == "dump":
        text = f"wrote {result.get('path')}  shape {result.get('shape')}  slots written {result.get('slots_written')}"
    else:
        text = "  ".join(f"{k}={result[k]}" for k in ("role", "observer", "layout_hash", "redundant_slots", "dispatch",
                                                     "slots_written", "passes_recorded") if k in result)
    _emit(args, result, text)


def cmd_audit(args) -> None:
    from .audit import audit, status_from_log
    from .record_client import call

    if args.url:
        status = call(args.url, "status", args.api_key)
    elif args.log:
        status = status_from_log(args.log)
    else:
        raise SceneEplbError("audit needs --url (the status route) or --log (the server log's startup lines)")
    checks = audit(status, args.layout, args.dispatch, args.recorder, args.log)
    ok = all(c.ok for c in checks)
    text = "\n".join(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in checks)
    _emit(args, {"ok": ok, "checks": [c.__dict__ for c in checks], "status": status}, text + f"\naudit: {'PASS' if ok else 'FAIL'}")
    if not ok:
        raise SystemExit(1)


def cmd_bench(args) -> None:
    from .bench import Scene, bench

    scene = Scene(args.scene, args.num_prompts, args.concurrency, args.request_rate, args.input_len, args.output_len,
                  args.prefix_share, args.cards, args.seed)
    extra = {"quantization": args.quantization, "chunk_size": args.chunk_size, "parallel": args.parallel}
    say = (lambda msg: None) if _quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    doc = bench(args.url, args.model, scene, Path(args.output), args.repeats, args.api_key,
                extra, say)
    agg = doc["aggregate"]
    lines = [f"wrote {args.output}  window {agg['window_s']} s  steady-state {agg['steady_state']}  failed {agg['failed']}"]
    for m in ("output_throughput_per_card", "prefill_throughput_per_card", "output_throughput_per_card_steady", "ttft_p99_ms"):
        v = agg[m]
        lines.append(f"  {m:36s} {v['mean'] if isinstance(v['mean'], str) else format(v['mean'], '.2f')}"
                     + (f" +- {v['ci95']:.2f}" if isinstance(v.get("ci95"), float) else ""))
    _emit(args, doc, "\n".join(lines))


def cmd_compare(args) -> None:
    from .bench import read_result
    from .compare import chart_png, compare, markdown

    a, b = read_result(args.a), read_result(args.b)
    names = (args.name_a, args.name_b)
    c = compare(a, b, names)
    text = markdown(c, names)
    if args.output:
        out = Path(args.output)
        atomic_write_bytes(out / "compare.md", text.encode())
        atomic_write_bytes(out / "compare.json", json.dumps(c.to_dict(), indent=1).encode())
        chart_png(c, a, b, out / "compare.png", names)
    _emit(args, c.to_dict(), text)


def _parse_layers(text: str, num_layers: int) -> tuple[int, ...]:
    """'3-60' or '3,5,7' or '3-10,12' into row indices."""
    out = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SceneEplbError(f"--moe-layers {text!r}: expected ranges like 3-60 or 3,5,7") from None
    return tuple(out)


def cmd_report(args) -> None:
    from .report import heatmap_png, markdown

    layout = read_layout(args.layout, _hint(args))
    with progress(f"reading {args.counts}"):
        counts = read_counts(args.counts)
    ev = evaluate(layout, counts)
    out = Path(args.output)
    with progress("drawing heat maps"):
        png = heatmap_png(layout, counts, out / "rank_load_heatmap.png")
    md = atomic_write_bytes(out / "report.md", markdown(ev, layout, images=[png.name]).encode())
    atomic_write_bytes(out / "scores.json", json.dumps({"summary": ev.summary(), "layers": ev.rows()}, indent=2).encode())
    _emit(args, {"report": str(md), "heatmap": str(png), "summary": ev.summary()}, _summary_text(ev) + f"\nwrote {md} and {png}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scene-eplb",
        description="Scene-specific static EPLB: fit an expert layout from recorded routing counts, "
        "check it, score it and convert it for vLLM, SGLang and vLLM-Ascend. Runs on CPU, no engine needed.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def remote(sp, url_required: bool = True, url_default: str | None = "http://localhost:8000", url_help: str | None = None):
        """--url and --api-key of a running server (the key defaults to $VLLM_API_KEY, as vLLM's own)."""
        if url_required:
            sp.add_argument("--url", required=True, help="server base URL")
        else:
            sp.add_argument("--url", default=url_default, help=url_help or f"server base URL (default {url_default})")
        sp.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), help="the server's --api-key (default: $VLLM_API_KEY)")

    def common(sp, geometry=False):
        sp.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
        sp.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
        if geometry:
            g = sp.add_argument_group("geometry of bare layout files (SGLang, vLLM-Ascend, .pt carry none or part of it)")
            g.add_argument("--ep-size", type=int, help="expert-parallel ranks")
            g.add_argument("--num-experts", type=int, help="logical experts (default: largest id + 1)")
            g.add_argument("--nodes", type=int, help="nodes the EP ranks span (default 1)")

    sp = sub.add_parser("inspect", help="summarise and validate a counts file")
    sp.add_argument("counts", help="counts: native .npz, SGLang-style .json or recorder .pt")
    common(sp)
    sp.set_defaults(func=cmd_inspect)

    sp = sub.add_parser("fit", help="fit a layout to counts", description="Fit a static layout: replica counts in the "
                        "redundant-slot budget, placement, bounded swaps, validation; prints train/holdout scores.")
    sp.add_argument("counts")
    sp.add_argument("--ep-size", type=int, required=True, help="expert-parallel ranks (EP size of the P node)")
    sp.add_argument("--redundant", type=int, required=True, help="redundant physical slots R (E + R divisible by ep-size)")
    sp.add_argument("--nodes", type=int, default=1, help="nodes the EP ranks span (default 1)")
    sp.add_argument("--dispatch", choices=DISPATCH_ALGORITHMS, default="static",
                    help="ep_dispatch_algorithm the layout will run under; the fitter balances its real replica shares (default static)")
    sp.add_argument("--robust", action="store_true", help="per layer, pick risk-weighted counts that minimise the expected per-slot peak on train slots")
    sp.add_argument("--expert-groups", type=int, default=1, metavar="N",
                    help="the model's routing groups (config.json n_group; DeepSeek-V3/R1: 8). Placement then spreads every "
                         "group and its halvings of neighbouring ids evenly over ranks, which held up better on other scenes "
                         "of real DeepSeek-V3 counts (benchmarks/bench_fit_vs_vllm.py). Default 1: no groups")
    sp.add_argument("-o", "--output", required=True, help="layout file to write")
    sp.add_argument("--format", choices=LAYOUT_FORMATS, default="native", help="layout file format (default native)")
    common(sp)
    sp.set_defaults(func=cmd_fit)

    sp = sub.add_parser("validate", help="check a layout file (and that it fits a model)")
    sp.add_argument("layout")
    sp.add_argument("--model", help="model directory or config.json: check MoE layers and experts against it")
    common(sp, geometry=True)
    sp.set_defaults(func=cmd_validate)

    sp = sub.add_parser("score", help="score a layout on counts (train/holdout, ideal and static dispatch)")
    sp.add_argument("layout")
    sp.add_argument("counts")
    common(sp, geometry=True)
    sp.set_defaults(func=cmd_score)

    sp = sub.add_parser("convert", help="convert counts or a layout between formats",
                        description=f"Counts formats: {', '.join(COUNTS_FORMATS)}. Layout formats: {', '.join(LAYOUT_FORMATS)}.")
    sp.add_argument("input")
    sp.add_argument("--to", required=True, choices=sorted(set(COUNTS_FORMATS + LAYOUT_FORMATS)), help="target format")
    sp.add_argument("-o", "--output", required=True)
    sp.add_argument("--moe-layers", help="layout rows that are MoE layers, e.g. 3-60 (for vllm-ascend export of a bare layout)")
    common(sp, geometry=True)
    sp.set_defaults(func=cmd_convert)

    sp = sub.add_parser("report", help="Markdown report plus PNG heat maps of per-rank load before/after")
    sp.add_argument("layout")
    sp.add_argument("counts")
    sp.add_argument("-o", "--output", required=True, help="report directory")
    common(sp, geometry=True)
    sp.set_defaults(func=cmd_report)

    sp = sub.add_parser("record", help="control a running server's recorder: start | stop | dump | status",
                        description="Drive the plugin's routes on a vLLM server started with scene_eplb in "
                        "--additional-config and VLLM_PLUGINS=scene_eplb. dump answers the path of the counts file "
                        "the server wrote inside its dump_dir.")
    sp.add_argument("action", choices=("start", "stop", "dump", "status"))
    remote(sp, url_required=False)
    sp.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the server (default 300)")
    common(sp)
    sp.set_defaults(func=cmd_record)

    sp = sub.add_parser("audit", help="check a running server loaded the intended layout, dispatch and recorder state",
                        description="Read the server's status route (and optionally its log's startup lines) and check: "
                        "layout hash equals the intended file's, redundant slots and dispatch algorithm as intended, recorder "
                        "state. Exit 0 when every check passes, 1 when one fails, 2 on an error.")
    remote(sp, url_required=False, url_default=None,
           url_help="server base URL (its status route); omit it and give --log alone where the plugin has no routes (vLLM-Ascend)")
    sp.add_argument("--layout", help="the intended layout file (omit for a server that must run the linear layout)")
    sp.add_argument("--dispatch", choices=DISPATCH_ALGORITHMS, help="the intended dispatch algorithm")
    sp.add_argument("--recorder", choices=("off", "idle", "recording"), default="idle",
                    help="intended recorder state (default idle: armed but not recording, right for a measurement run)")
    sp.add_argument("--log", help="the server log: every worker's startup line must agree with the status route "
                    "(without --url: with the first worker's line, which stands in for the route)")
    common(sp)
    sp.set_defaults(func=cmd_audit)

    sp = sub.add_parser("bench", help="run a named scene against a server through vLLM's `vllm bench serve`",
                        description="Drive an OpenAI-compatible server with vLLM's own benchmark (random dataset, fixed "
                        "lengths) and save per-card throughput (whole run and steady state), TTFT/TPOT percentiles and the "
                        "scene manifest (with the server's status route) to one JSON file. Needs vLLM installed.")
    remote(sp)
    sp.add_argument("--model", required=True, help="served model name (and tokenizer path)")
    sp.add_argument("--scene", required=True, help="scene name, saved in the manifest")
    sp.add_argument("-n", "--num-prompts", type=int, required=True, help="request count N")
    sp.add_argument("-c", "--concurrency", type=int, required=True, help="max concurrent requests C")
    sp.add_argument("-r", "--request-rate", type=float, default=float("inf"), help="request rate r in req/s (default inf)")
    sp.add_argument("--input-len", type=int, required=True)
    sp.add_argument("--output-len", type=int, required=True)
    sp.add_argument("--prefix-share", type=float, default=0.0, help="share of each prompt that is a common prefix (cache scene)")
    sp.add_argument("--cards", type=int, default=1, help="all P + D cards: throughput per card divides by this")
    sp.add_argument("--repeats", type=int, default=1, help="runs; >= 2 gives a mean and a 95%% confidence interval")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--quantization", help="for the manifest (default NOT_OBSERVED)")
    sp.add_argument("--chunk-size", type=int, help="the server's chunked-prefill size, for the manifest")
    sp.add_argument("--parallel", help="the server's parallel geometry, e.g. TP2-EP2, for the manifest")
    sp.add_argument("-o", "--output", required=True, help="result JSON to write")
    common(sp)
    sp.set_defaults(func=cmd_bench)

    sp = sub.add_parser("compare", help="deltas between two bench results (refuses different N/C/r)")
    sp.add_argument("a", help="reference result (e.g. linear layout)")
    sp.add_argument("b", help="result to compare (e.g. fitted layout)")
    sp.add_argument("--name-a", default="A")
    sp.add_argument("--name-b", default="B")
    sp.add_argument("-o", "--output", help="directory for compare.md, compare.json and compare.png")
    common(sp)
    sp.set_defaults(func=cmd_compare)
    return p


def main(argv: list[str] | None = None) -> int:
    global _quiet
    args = build_parser().parse_args(argv)
    _quiet = args.quiet
    try:
        args.func(args)
    except SceneEplbError as exc:
        print(f"scene-eplb: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (e.g. piped into head)
        sys.stderr.close()
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
