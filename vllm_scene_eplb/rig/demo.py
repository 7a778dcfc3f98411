"""The end-to-end demo on CPU: record a scene on a real vLLM server, fit a layout, restart with it, A/B.

    python -m vllm_scene_eplb.rig.demo --out out/demo [--geometry tp2|dp2] [--skew 0.3] [--num-prompts 1400]

1. generate a tiny Qwen3-MoE (16 experts, 4 MoE layers, large experts) with a skewed router;
2. start it with the plugin (TP=2 x EP=2, or ``--geometry dp2``: the field geometry in miniature,
   DP=2 x TP=1 x EP=2), P role, warm up, record the target load, dump;
3. fit a layout (2 redundant slots, static dispatch) and write the report with heat maps; ask
   ``advise`` (the recording server times its experts) what throughput ratio the layout will give;
4. measure the target load on the linear layout (recorder off), restart with the fitted layout, same load;
5. compare, and write ``report/summary.json`` with ``prefill_throughput_ratio`` (fitted / linear) beside
   the ratio ``advise`` predicted (``predicted_vs_measured``).

With ``--factorial --repeats R``, steps 4-5 become the factorial A/B (``factorial``): the linear layout
with the same redundant slots (baseline) and the fitted one (candidate), each under static and
dynamic dispatch, R rounds that each run the four arms once in a seeded random order (``--seed``), a
server start per run; ``report/summary.json`` then holds ``order``, ``arms`` and ``effects``
(``layout`` / ``dispatch`` / ``interaction``: ``ratio``, ``ci``, ``verdict``; no verdict under 3 rounds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..ab.bench import bench
from ..ab.compare import chart_png, compare, markdown
from ..ab.factorial import ARMS, analyse, effect_line, round_orders
from ..ab.factorial import chart_png as factorial_png
from ..ab.factorial import markdown as markdown_effects
from ..ab.results import BenchLoad, prefill_metric
from ..advise import advise
from ..client.record import answer
from ..fileio import atomic_write_bytes, atomic_write_files
from ..fit import FitOptions, fit
from ..formats import read_counts, write_layout
from ..layouts.counts import Counts
from ..layouts.layout import Geometry, Layout, linear_map
from ..layouts.report import write_report
from ..protocol import Advice, StatusAnswer, TimingWindow
from .local_server import GEOMETRIES, engine_args, pin_host, start_server
from .tiny_model import TinyMoeSpec, make_tiny_moe

DEMO_SPEC = TinyMoeSpec(num_experts=16, num_layers=4, hidden_size=256, moe_intermediate_size=1024)
# Later flags win: 4096-token chunks and 2048-token contexts for the 512-token scene.
DEMO_ARGS = ("--max-num-batched-tokens", "4096", "--max-model-len", "2048", "--enable-expert-parallel")
# Both sides time their experts (live.time): the linear server's window feeds advise, and the A/B stays like for like.
TIMED = {"time_moe": True, "live_window_s": 5}
RANK_CORES = "0|1"  # the demo servers' workers, one core each (local_server's default binding)
GEOMETRY_NAMES = {"tp2": "TP=2 x EP=2 (DP=1)", "dp2": "DP=2 x TP=1 x EP=2 (the field geometry in miniature)"}


def say(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Loads:
    """The demo's three loads on one input length: the measured ``target``, a small ``warmup`` before
    each measurement, and the ``record`` load the recording server counts (each its own seed)."""

    target: BenchLoad
    warmup: BenchLoad
    record: BenchLoad

    @classmethod
    def of(cls, num_prompts: int, concurrency: int, input_len: int, output_len: int = 4, record_prompts: int = 0) -> Loads:
        """Prefill loads (4 output tokens) by default; a longer ``output_len`` makes them decode loads.
        The record load has ``record_prompts`` requests (0: eight per concurrent client)."""

        def scene(name: str, n: int, seed: int) -> BenchLoad:
            return BenchLoad(
                name=name,
                num_prompts=n,
                concurrency=concurrency,
                request_rate=float("inf"),
                input_len=input_len,
                output_len=output_len,
                cards=2,
                seed=seed,
            )

        return cls(
            target=scene(f"prefill-{input_len}" if output_len == 4 else f"decode-{input_len}x{output_len}", num_prompts, 0),
            warmup=scene("warm-up", 4 * concurrency, 1),
            record=scene("record", record_prompts or 8 * concurrency, 2),
        )


@dataclass(frozen=True)
class Rig:
    """What every step of a demo run shares: the generated model and its router ``skew``, the output
    folder, the server geometry and the loads."""

    model: Path
    skew: float
    out: Path
    geometry: str
    loads: Loads


@dataclass(frozen=True)
class Candidate:
    """The fitted layout, the file it was written to, and what ``advise`` said of it."""

    layout: Layout
    path: Path
    advice: Advice


@dataclass(frozen=True)
class Recording:
    """What the recording server gave: its status after the record (the timing window ``advise``
    reads), the dump's path, and the counts read back from it."""

    status: StatusAnswer
    dump_path: str
    counts: Counts


def plugin_config(dumps: Path, layout: Path | None = None, dispatch: str = "static") -> dict:
    """The P-role plugin settings of a demo server (timed, dumping under ``dumps``), with ``layout``."""
    cfg: dict = {"role": "prefill", "dump_dir": str(dumps), **TIMED}
    if layout is not None:
        cfg.update(layout=str(layout), dispatch=dispatch)
    return cfg


def serve(rig: Rig, name: str, cfg: dict):
    """A demo server (``local_server``) with the plugin settings ``cfg``, ready."""
    srv = start_server(
        rig.model,
        rig.out / "logs",
        name,
        extra=["--additional-config", json.dumps({"scene_eplb": cfg})],
        engine_args=engine_args(rig.geometry) + DEMO_ARGS,
        cores=RANK_CORES,
    )
    t0 = time.time()
    try:
        srv.wait_ready()
    except BaseException:
        srv.stop()  # a server that never got ready must not outlive the demo
        raise
    say(f"{name} server ready in {time.time() - t0:.0f}s ({srv.url})")
    return srv


def warm_up(srv, rig: Rig, name: str) -> None:
    """The small warm-up load before a measurement (the first batches after a start run slow)."""
    bench(srv.url, str(rig.model), rig.loads.warmup, rig.out / f"warmup-{name}.json", progress=say)


def measure(srv, rig: Rig, scene: BenchLoad, name: str, repeats: int = 1) -> dict:
    """``scene`` on ``srv`` with the recorder off (refused otherwise), ``repeats`` times, saved as ``name``."""
    if answer(srv.url, "status").status.recording:
        raise SystemExit("demo: the recorder must be off for a measurement run")
    doc = bench(srv.url, str(rig.model), scene, rig.out / f"{name}.json", repeats, extra={"chunk_size": 4096}, progress=say)
    agg = doc["aggregate"]
    say(f"{name}: prefill {agg['prefill_throughput_per_card']['mean']:.0f} tok/s/card, window {agg['window_s']:.0f}s")
    return doc


def record(srv, rig: Rig, name: str = "record") -> Recording:
    """Warm ``srv`` up, record ``loads.record``, keep the status (its timing window) and dump; the
    load's result and the status are saved as ``{name}-load.json`` and ``{name}-timing.json``."""
    warm_up(srv, rig, name)
    answer(srv.url, "start")
    bench(srv.url, str(rig.model), rig.loads.record, rig.out / f"{name}-load.json", progress=say)
    answer(srv.url, "stop")
    status = answer(srv.url, "status")  # the timing window of the recorded load: what advise needs
    atomic_write_bytes(rig.out / f"{name}-timing.json", json.dumps(status.to_wire(), indent=1).encode())
    dump = answer(srv.url, "dump")
    say(f"dumped {dump.path} {list(dump.shape)}")
    return Recording(status, dump.path, read_counts(dump.path))


def fit_and_advise(rec: Recording, redundant: int, out: Path) -> Candidate:
    """The fitted layout (``redundant`` slots, static dispatch) written with its report, and what
    ``advise`` says of it from the recording's counts and timing window."""
    counts = rec.counts
    fitted = fit(counts, FitOptions(Geometry(counts.num_experts, redundant, ep_size=2), dispatch="static"))
    path = write_layout(fitted, out / "layout.json")
    (ev,), _, _ = write_report(fitted, [("demo", counts)], out / "report")
    scores = ev.summary()
    say(f"fitted {path}: ideal score median {scores['old_train']['median']:.4f} (linear) -> {scores['new_train']['median']:.4f}")
    window = TimingWindow.of_status(rec.status, "the linear server's status", len(fitted.moe_layers))
    advice = advise(counts, fitted, "static", window)
    say(f"advise: {advice.verdict}, predicted throughput ratio {advice.predicted_throughput_ratio}")
    for why in advice.reasons:
        say(f"advise: {why}")
    return Candidate(fitted, path, advice)


def _factorial(rig: Rig, layouts: dict[str, Path], rounds: int, seed: int) -> dict:
    """The four arms (baseline and candidate layout x static and dynamic dispatch), ``rounds`` rounds
    each running every arm once in a seeded random order, a server start per run, then their effects
    (``factorial.analyse``, the same code as ``scene-eplb compare --factorial``)."""
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    order = round_orders(rounds, seed)
    for rep, arms in enumerate(order):
        say(f"factorial round {rep + 1}/{rounds}: {' -> '.join(arms)}")
        for arm in arms:
            layout, dispatch = arm.split("-")
            name = f"{arm}-{rep + 1}"
            srv = serve(rig, name, plugin_config(rig.out / "dumps", layouts[layout], dispatch))
            try:
                warm_up(srv, rig, name)
                results[arm].append(measure(srv, rig, rig.loads.target, name))
            finally:
                srv.stop()
    summary = analyse(results, prefill_metric([doc for docs in results.values() for doc in docs]), order)
    return {**summary, "seed": seed, "layouts": {k: str(v) for k, v in layouts.items()}}


def run_factorial(rig: Rig, rec: Recording, cand: Candidate, rounds: int, seed: int) -> dict:
    """The demo's factorial mode: the four-arm A/B after the recording, written to ``report/``."""
    g = cand.layout.geometry
    baseline = write_layout(Layout(linear_map(g, cand.layout.num_layers), g, cand.layout.moe_layers), rig.out / "baseline.json")
    summary = _factorial(rig, {"baseline": baseline, "candidate": cand.path}, rounds, seed)
    summary.update(skew=rig.skew, geometry=GEOMETRY_NAMES[rig.geometry], counts=rec.dump_path, advice=cand.advice.to_wire())
    text = markdown_effects(summary)
    report = rig.out / "report"
    atomic_write_files(
        report,
        {
            "factorial.md": text.encode(),
            "factorial.png": factorial_png(summary),
            "summary.json": json.dumps(summary, indent=1, default=str).encode(),
        },
    )
    print(text)
    print(
        f"factorial A/B on {GEOMETRY_NAMES[rig.geometry]} ({summary['metric']}, {rounds} rounds in random order): "
        + effect_line(summary)
        + f"; report in {report}"
    )
    return summary


def run_ab(rig: Rig, rec: Recording, a: dict, cand: Candidate, repeats: int) -> dict:
    """The demo's default mode: the target load on a server restarted with the fitted layout, compared
    with the linear server's run ``a``, written to ``report/``."""
    srv = serve(rig, "fitted", plugin_config(rig.out / "dumps", cand.path))
    try:
        warm_up(srv, rig, "fitted")
        b = measure(srv, rig, rig.loads.target, "fitted", repeats)
        fitted_live = answer(srv.url, "status").live
    finally:
        srv.stop()
    names = ("linear", "fitted")
    c = compare(a, b, names)
    text = markdown(c, names)
    report = rig.out / "report"
    atomic_write_files(report, {"compare.md": text.encode(), "compare.png": chart_png(c, names)})
    metric = prefill_metric([a, b])
    row = next(r for r in c.rows if r["metric"] == metric)
    advice = cand.advice
    summary = {
        "prefill_throughput_ratio": row["ratio"],
        "prefill_metric": row["metric"],
        "verdict": row["verdict"],
        "skew": rig.skew,
        "geometry": GEOMETRY_NAMES[rig.geometry],
        "parallel": a["manifest"]["parallel"],
        "layout_hash": cand.layout.digest(),
        "counts": rec.dump_path,
        "comparison": c.to_dict(),
        "advice": advice.to_wire(),
        "predicted_vs_measured": {
            "predicted": advice.predicted_throughput_ratio,
            "measured": row["ratio"],
            "metric": row["metric"],
        },
        "live": {
            side: None if live is None else live.to_wire()
            for side, live in (("linear", rec.status.live), ("fitted", fitted_live))
        },
        "manifests": {"linear": a["manifest"], "fitted": b["manifest"]},
    }
    atomic_write_bytes(report / "summary.json", json.dumps(summary, indent=1, default=str).encode())
    print(text)
    print(
        f"prefill throughput fitted / linear on {GEOMETRY_NAMES[rig.geometry]}: "
        f"{row['ratio'] if isinstance(row['ratio'], str) else format(row['ratio'], '.3f')} ({row['metric']}); "
        f"advise predicted {_ratio_text(advice.predicted_throughput_ratio)} ({advice.verdict}); report in {report}"
    )
    return summary


def prepare(out: Path, skew: float, loads: Loads, geometry: str, spec: TinyMoeSpec = DEMO_SPEC) -> Rig:
    """The output folder and the generated model (``spec``) at router ``skew``."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    model = make_tiny_moe(out / "model", dataclasses.replace(spec, skew=skew))
    say(f"generated {model} (skew {skew})")
    return Rig(model, skew, out, geometry, loads)


def run(
    out: Path,
    skew: float,
    num_prompts: int,
    concurrency: int,
    input_len: int,
    redundant: int,
    repeats: int = 1,
    geometry: str = "tp2",
    factorial: bool = False,
    seed: int = 0,
) -> dict:
    """The demo: generate the model, record on the linear server (and measure there, unless
    ``factorial``), fit and ask ``advise``, then the A/B of the chosen mode."""
    say(f"geometry {GEOMETRY_NAMES[geometry]}")
    host = pin_host(RANK_CORES)
    say(
        f"API servers, engine cores and the bench's clients on cores {sorted(host)}, the ranks on {RANK_CORES}"
        if host
        else f"no core to spare: the API servers, engine cores and clients share the ranks' cores ({RANK_CORES})"
    )
    rig = prepare(out, skew, Loads.of(num_prompts, concurrency, input_len), geometry)
    srv = serve(rig, "linear", plugin_config(out / "dumps"))
    try:
        rec = record(srv, rig)
        a = None if factorial else measure(srv, rig, rig.loads.target, "linear", repeats)
    finally:
        srv.stop()
    cand = fit_and_advise(rec, redundant, out)
    if a is None:
        return run_factorial(rig, rec, cand, repeats, seed)
    return run_ab(rig, rec, a, cand, repeats)


def _ratio_text(ratio) -> str:
    return "n/a" if ratio is None else f"{ratio:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_scene_eplb.rig.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/demo", help="output folder (default out/demo)")
    ap.add_argument("--skew", type=float, default=0.3, help="router skew of the generated model (0 = unskewed)")
    ap.add_argument("--num-prompts", type=int, default=1400, help="requests N of the measured scene (same on both sides)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--redundant", type=int, default=2, help="redundant slots of the fitted layout")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measured runs per side (>= 2 gives confidence intervals); with "
        "--factorial, the rounds of all four arms (>= 2; a verdict needs 3)",
    )
    ap.add_argument("--seed", type=int, default=0, help="with --factorial: the seed of each round's random arm order")
    ap.add_argument(
        "--factorial",
        action="store_true",
        help="instead of linear vs fitted: the factorial A/B, layouts {baseline (linear, same redundant slots), "
        "fitted} x dispatch {static, dynamic}, each round the four arms in a seeded random order with a restart "
        "per run; reports the layout effect, the dispatch effect and their interaction with t intervals over "
        "rounds (report/factorial.md)",
    )
    ap.add_argument(
        "--geometry",
        choices=[g for g in GEOMETRIES if g in GEOMETRY_NAMES],
        default="tp2",
        help="tp2: TP=2 x EP=2 (default); dp2: DP=2 x TP=1 x EP=2, the field P node's DP x EP in miniature",
    )
    a = ap.parse_args(argv)
    if a.factorial and a.repeats < 2:
        ap.error("--factorial needs --repeats 2 or more (an interval needs two rounds; a verdict three)")
    run(Path(a.out), a.skew, a.num_prompts, a.concurrency, a.input_len, a.redundant, a.repeats, a.geometry, a.factorial, a.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
