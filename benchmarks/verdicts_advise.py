"""How far `advise` is from the truth it predicts, on real DeepSeek-V3 counts and on the real CPU engine.

``advise_calibration()``: a simulated server (``vllm_scene_eplb.rig.simulated``) per scene of
the shipped counts (data/deepseek_v3_counts: every MoE layer's expert distribution) at EP16 and
EP32. Per-pass routing is sampled from each layer's distribution (prefill at 4096 tokens per
pass, one pass per ring entry; decode at 256 tokens per pass, 16 passes per entry as the decode
default, and the same recording at one per entry), a rank's MoE time is linear in its assignments
(``DEVICES``), the timing window's measurements carry ``NOISE`` (3%) relative noise per rank and
layer and per sub-window (``--noise``), every layer waits for its slowest rank, and the true ratio of a candidate over the
linear layout is computed pass by pass on 1024 fresh passes. Candidates: layouts fitted on the
recording (``static`` at R = ep and R = 0, ``dynamic`` at R = ep) and the running layout's own
placement under redundancy 0 (a gain of about nothing). Printed: the prediction error against the
truth, the difference between the 1- and 16-step dumps of one recording, what the slowest rank of
the mean pass (the aggregate model) would have said, and the false-``trial`` rate on candidates
whose true per-pass gain is under the noise floor. The truth shares advise's dispatch operator and
linear device, so this measures the per-pass model (thinning, fit, fresh passes), not the
assumptions themselves (docs/live-fitness.md says where they fail).

``engine_calibration()``: predicted against measured on the real CPU engine (TP=2 x EP=2, the demo's
generated model and loads) at router skews 0, 0.5 and 1: per skew, a recording on the linear server,
a fitted layout (2 redundant slots, ``static``) and ``advise``'s predicted throughput ratio from that
server's dump and timing window; then the fitted server started beside the linear one, both alive,
and at least 3 rounds of the same target load on each, the side that runs first alternating. The
measured ratio fitted / linear and its 95% interval come from ``stats.block_effects`` over the
rounds (each run's place in its round a term of the model), as the factorial A/B's do. Then the
fitted server records the same load, and its own record window splits the error
(``advise.error_split``): the MoE critical path predicted against measured, the time outside MoE
(step and gap), and tokens per pass, each a factor on the ratio, printed under the row.

``engine_decode()`` (``--engine decode``): the same on a model whose passes are decode-sized (64
experts, top-4, 8 requests decoding at a time, so a pass reads the weights of about half the
experts): both servers alive and rounds of a record window on each, back to back; per round
``advise`` on that round's linear window, its model's slowest ranks against both windows' slowest
rank means (like for like), and its per-pass price of the MoE critical path against each server's
critical path measured pass by pass (``TimingWindow.critical_ms``: the running server on the passes
it priced, the candidate on its own); the mean error over rounds within 5% on each; no A/B.
``--regime`` picks the model and load (``DECODE_REGIMES``): ``decode`` (the check) or
``short`` (issue 47's: 1024-wide experts, router skew 1, 6-token prompts and 6 output tokens).
``--second linear`` is the control: the second server loads the linear placement itself as its
layout, so the model's error on it is the one between two server instances of one layout (what
no count -> time model can price), not a layout's.

    python benchmarks/verdicts_advise.py [--data DIR] [--json OUT] [--quick] [--engine no|also|only|decode] [--regime decode|short]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from sample_data import DEFAULT

from vllm_scene_eplb.ab.results import prefill_metric
from vllm_scene_eplb.ab.stats import block_effects, check_positive
from vllm_scene_eplb.advise import NOISE_FLOOR, Setup, advise
from vllm_scene_eplb.advise.error_split import ErrorSplit, priced_passes_ms
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fileio import atomic_write_bytes
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import read_counts, write_layout
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry, Layout, linear_map
from vllm_scene_eplb.protocol import TimingWindow
from vllm_scene_eplb.rig import demo
from vllm_scene_eplb.rig.local_server import pin_host
from vllm_scene_eplb.rig.simulated import Device, Server, SimulatedTraffic, linear_setup, rank_ms
from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec

DEEPSEEK_V3_GROUPS = 8
TOP_K = 8
# (file, role, tokens per pass, steps per entry of the role's recorder)
SCENES = (
    ("prefill_in4096.json", "prefill", 4096, 1),
    ("prefill_in1024.json", "prefill", 4096, 1),
    ("decode_in1000out1000.json", "decode", 256, 16),
)
# rank ms per layer and pass = a + b x assignments; the step's time outside MoE
DEVICES = {"prefill": Device(a_ms=0.05, b_ms=0.0004, other_ms=40.0), "decode": Device(a_ms=0.02, b_ms=0.0004, other_ms=4.0)}
NOISE = 0.03  # relative sd of the timing window's measurement noise (rank ms per layer, sub-window steps)
RECORDED, FRESH = 256, 1024  # passes in the recording, passes the truth is computed on
TARGETS = {"k1_vs_k16": 0.005, "vs_truth": 0.02}
SKEWS = (0.0, 0.5, 1.0)  # router skews of the engine calibration (the demo model's default is 0.3)
# The decode-sized check: many experts and a few tokens a pass (8 requests decoding at a time)
DECODE_SPEC = TinyMoeSpec(num_experts=64, top_k=4, num_layers=4, hidden_size=256, moe_intermediate_size=512)
DECODE_LOADS = demo.Loads.of(64, concurrency=8, input_len=32, output_len=48)
DECODE_TARGET = 0.05  # |modelled / measured - 1| on each server, the mean over rounds (issues 37 and 47)


@dataclass(frozen=True)
class DecodeRegime:
    """A decode-sized check's generated model, its router skew and the loads."""

    spec: TinyMoeSpec
    skew: float
    loads: demo.Loads


DECODE_REGIMES = {
    "decode": DecodeRegime(DECODE_SPEC, 0.5, DECODE_LOADS),
    # issue 47's: 1024-wide experts, skew 1, short prompts and 6 output tokens from 8 clients (256 recorded)
    "short": DecodeRegime(
        replace(DECODE_SPEC, moe_intermediate_size=1024), 1.0, demo.Loads.of(64, 8, input_len=6, output_len=6, record_prompts=256)
    ),
}


def distributions(path: Path) -> np.ndarray:
    """Each MoE layer's expert distribution [L_moe, E] of a counts file."""
    total = read_counts(path).total().astype(np.float64)
    moe = total[total.sum(axis=1) > 0]
    return moe / moe.sum(axis=1, keepdims=True)


def _fit(counts: Counts, redundant: int, ep: int, dispatch: str) -> Layout:
    total = Counts(counts.total()[None], {"moe_layers": list(range(counts.num_layers))})
    options = FitOptions(Geometry(counts.num_experts, redundant, ep), dispatch=dispatch, expert_groups=DEEPSEEK_V3_GROUPS)
    return fit(total, options)


def candidates(counts: Counts, ep: int) -> dict[str, tuple[Layout, str]]:
    """The layouts tried at ``ep``, fitted on the recording's total, with the dispatch each runs."""
    linear = linear_setup(counts.num_experts, ep, counts.num_layers)
    return {
        "static R=ep": (_fit(counts, ep, ep, "static"), "static"),
        "static R=0": (_fit(counts, 0, ep, "static"), "static"),
        "dynamic R=ep": (_fit(counts, ep, ep, "dynamic"), "dynamic"),
        "linear placement": (Layout(linear.p2l, linear.geometry), "dynamic"),
    }


def advise_calibration(
    data: str | Path = DEFAULT, eps: tuple[int, ...] = (16, 32), quick: bool = False, noise: float = NOISE
) -> dict:
    """Advise against the per-pass truth (see the module docstring): one row per scene, EP, running
    layout and candidate, plus the summary figures and whether the issue's targets hold."""
    rows = []
    scenes = SCENES[::2] if quick else SCENES
    for file, role, tokens, k in scenes:
        scene = SimulatedTraffic(distributions(Path(data) / file), tokens, TOP_K, role)
        for ep in eps:
            rec = scene.passes(RECORDED, np.random.default_rng(ep))
            linear = Server(scene, DEVICES[role], ep, noise=noise, seed=ep)
            tried = candidates(linear.dump(rec, 1), ep)
            fitted, _ = tried["static R=0"]
            for running_name, srv in (
                ("linear", linear),
                ("static R=0", Server(scene, DEVICES[role], ep, fitted, "static", noise, ep)),
            ):
                for name, (layout, dispatch) in tried.items():
                    if running_name != "linear" and name == "linear placement":
                        continue
                    rows.append(_case(srv, rec, k, running_name, name, layout, dispatch, file, ep))
    return summarise(rows)


def _case(
    srv: Server, rec: np.ndarray, k: int, running_name: str, name: str, layout: Layout, dispatch: str, file: str, ep: int
) -> dict:
    """One candidate on one server: advise on the 1- and k-step dumps of ``rec``, and the truth."""
    t0 = time.perf_counter()
    answers = {
        s: advise(srv.dump(rec, s), layout, dispatch, srv.timing_window(rec, s), running=srv.running) for s in sorted({1, 16, k})
    }
    elapsed = (time.perf_counter() - t0) / len(answers)
    truth = srv.true_ratio(layout, dispatch, FRESH, np.random.default_rng(1000 + ep))
    aggregate = _aggregate_ratio(srv, rec, layout, dispatch)
    ratios = {s: a.predicted_throughput_ratio for s, a in answers.items()}
    print(
        f"{file:26s} EP{ep:<3d} running {running_name:10s} {name:17s} truth {truth:.4f}  predicted "
        + "  ".join(f"k={s}: {'n/a' if r is None else f'{r:.4f}'} ({answers[s].verdict})" for s, r in ratios.items())
        + f"  aggregate {aggregate:.4f}  [{elapsed:.1f} s each]",
        flush=True,
    )
    return {
        "scene": file,
        "role": srv.scene.role,
        "ep": ep,
        "running": running_name,
        "candidate": name,
        "true_ratio": truth,
        "aggregate_ratio": aggregate,
        "predicted": {str(s): r for s, r in ratios.items()},
        "verdict": {str(s): a.verdict for s, a in answers.items()},
        "noise_floor": answers[k].details.get("noise_floor", NOISE_FLOOR),
        "advise_seconds": elapsed,
    }


def _aggregate_ratio(srv: Server, rec: np.ndarray, layout: Layout, dispatch: str) -> float:
    """What the slowest rank of the *mean* pass predicts (the model before it went per pass), for comparison."""
    mean = rec.mean(axis=0, keepdims=True)
    cand = Setup.of(layout, layout.geometry, dispatch, list(range(rec.shape[1])), None)
    rng = np.random.default_rng(0)  # (the devices here have no cost per active slot: nothing is drawn)
    c_now, c_cand = (float(rank_ms(srv.device, s, mean, rng).max(axis=2).sum()) for s in (srv.setup, cand))
    return (srv.device.other_ms + c_now) / (srv.device.other_ms + c_cand)


def summarise(rows: list[dict]) -> dict:
    """The figures of ``advise_calibration``: errors, the k=1 / k=16 gap, the false-trial rate."""
    errors = [abs(r - row["true_ratio"]) for row in rows for r in row["predicted"].values() if r is not None]
    aggregate_errors = [row["aggregate_ratio"] - row["true_ratio"] for row in rows]
    gaps = [abs(row["predicted"]["1"] - row["predicted"]["16"]) for row in rows if None not in row["predicted"].values()]
    under = [(row, v) for row in rows for v in row["verdict"].values() if row["true_ratio"] - 1 < row["noise_floor"]]
    over = [(row, v) for row in rows for v in row["verdict"].values() if row["true_ratio"] - 1 >= row["noise_floor"]]
    ep16 = [row for row in rows if row["ep"] == 16]
    ep16_ok = all(
        abs(row["predicted"]["1"] - row["predicted"]["16"]) < TARGETS["k1_vs_k16"]
        and all(abs(r - row["true_ratio"]) < TARGETS["vs_truth"] for r in row["predicted"].values())
        for row in ep16
        if None not in row["predicted"].values()
    )
    summary = {
        "cases": len(rows),
        "max_abs_error": max(errors, default=None),
        "mean_abs_error": float(np.mean(errors)) if errors else None,
        "max_k1_k16_gap": max(gaps, default=None),
        "aggregate_bias_max": max(aggregate_errors, default=None),
        "aggregate_bias_mean": float(np.mean(aggregate_errors)) if aggregate_errors else None,
        "under_floor_verdicts": len(under),
        "false_trial_rate": (sum(v == "trial" for _, v in under) / len(under)) if under else None,
        "over_floor_verdicts": len(over),
        "trial_rate_over_floor": (sum(v == "trial" for _, v in over) / len(over)) if over else None,
        "ep16_targets_met": ep16_ok,
    }
    return {"rows": rows, "summary": summary}


def _ab_rounds(rig, servers: dict, repeats: int) -> tuple[list[list[float]], list[list[int]], str]:
    """``repeats`` rounds of the target load on both live servers, the side that runs first
    alternating (linear first in even rounds): per round [linear, fitted] steady prefill throughput
    per card (whole-run where a run had no steady window), where each ran in its round, the metric."""
    docs: dict[str, list[dict]] = {"linear": [], "fitted": []}
    positions = []
    for r in range(repeats):
        order = ("linear", "fitted") if r % 2 == 0 else ("fitted", "linear")
        for side in order:
            docs[side].append(demo.measure(servers[side], rig, rig.loads.target, f"{side}-{r + 1}"))
        positions.append([order.index("linear"), order.index("fitted")])
    metric = prefill_metric(docs["linear"] + docs["fitted"])
    values = [[docs[side][r]["aggregate"][metric]["mean"] for side in ("linear", "fitted")] for r in range(repeats)]
    check_positive(values, f"engine calibration: {metric}")
    return values, positions, metric


def engine_skew(out: Path, skew: float, repeats: int, loads: demo.Loads, redundant: int = 2) -> dict:
    """One router skew: record on the linear server, fit, ``advise``, then both servers alive and the
    measured rounds alternating between them (``_ab_rounds``); the measured ratio fitted / linear is
    the block model's (``stats.block_effects`` over rounds, with each run's place in its round)."""
    rig = demo.prepare(out, skew, loads, "tp2")
    linear = demo.serve(rig, "linear", demo.plugin_config(out / "dumps"))
    try:
        rec = demo.record(linear, rig)
        cand = demo.fit_and_advise(rec, redundant, out)
        fitted = demo.serve(rig, "fitted", demo.plugin_config(out / "dumps", cand.path))
        try:
            demo.warm_up(fitted, rig, "fitted")
            demo.warm_up(linear, rig, "linear")
            values, positions, metric = _ab_rounds(rig, {"linear": linear, "fitted": fitted}, repeats)
            own = demo.record(fitted, rig, "fitted-record")  # the candidate's own window, for the split
        finally:
            fitted.stop()
    finally:
        linear.stop()
    (effect,), note = block_effects(np.log(values), [(-1.0, 1.0)], np.array(positions))
    split = _split(cand, rec, own, effect.ratio)
    predicted = cand.advice.predicted_throughput_ratio
    ci = effect.ci
    bound = cand.advice.details.get("bound_ratio")
    row = {
        "skew": skew,
        "verdict": cand.advice.verdict,
        "predicted": predicted,
        "bound": bound,  # where the window leaves the slope open: the steepest one's ratio
        "measured": effect.ratio,
        "measured_ci": list(ci) if ci else None,
        "predicted_in_ci": None if ci is None or predicted is None else bool(ci[0] <= predicted <= ci[1]),
        "error": None if predicted is None else predicted - effect.ratio,
        "measured_verdict": effect.verdict,
        "step_ms": cand.advice.details.get("step_ms"),  # the record window's mean step
        "gap_ms": cand.advice.details.get("gap_ms"),  # and the mean busy pause before the next one
        "metric": metric,
        "rounds": values,
        "positions": positions,
        "model": note,
        "reasons": list(cand.advice.reasons),
        "split": split.to_dict() if isinstance(split, ErrorSplit) else split,
    }
    print(
        f"skew {skew}: advise {row['verdict']} predicted {_num(predicted)} (bound {_num(bound)}); measured {effect.ratio:.3f} "
        f"[{_num(ci[0] if ci else None)}, {_num(ci[1] if ci else None)}] ({effect.verdict}, {repeats} rounds, {metric})",
        flush=True,
    )
    for line in split.lines() if isinstance(split, ErrorSplit) else [f"no split: {split}"]:
        print(f"  {line}", flush=True)
    return row


def _split(
    cand: demo.Candidate, linear: demo.Recording, own: demo.Recording, measured: float | None, own_passes: bool = False
) -> ErrorSplit | str:
    """advise's prediction against the candidate server's own record window (``ErrorSplit``), or why
    there is none; ``own_passes``: the candidate's per-pass price also on its own dump's passes."""
    layers = len(cand.layout.moe_layers)
    now = TimingWindow.of_status(linear.status, "the linear server's status", layers)
    mine = TimingWindow.of_status(own.status, "the fitted server's status", layers)
    if now is None or mine is None:
        return "a server has no timed window"
    try:
        d = cand.advice.details
        priced = priced_passes_ms(d["model"], own.counts, cand.layout, "static") if own_passes and "model" in d else None
        return ErrorSplit.of(d, now, mine, measured, priced)
    except SceneEplbError as exc:
        return str(exc)


def engine_calibration(
    out: str | Path = "out/verdicts-engine", skews: tuple[float, ...] = SKEWS, repeats: int = 3, num_prompts: int = 600
) -> dict:
    """Predicted against measured on the real CPU engine (TP=2 x EP=2, the demo's model and loads):
    per router skew a recording, a fitted layout (2 redundant slots, static), ``advise``'s predicted
    throughput ratio, and the measured ratio over ``repeats`` alternating rounds with both servers alive."""
    if repeats < 3:
        raise SystemExit("engine calibration: at least 3 repeats per side")
    _pin()
    loads = demo.Loads.of(num_prompts, concurrency=8, input_len=512)
    rows = [engine_skew(Path(out) / f"skew{skew}", skew, repeats, loads) for skew in skews]
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    summary = {
        "skews": list(skews),
        "repeats_per_side": repeats,
        "num_prompts": num_prompts,
        "max_abs_error": max(errors, default=None),
        "predicted_in_ci": sum(bool(r["predicted_in_ci"]) for r in rows),
        "trial_verdicts": [r["verdict"] for r in rows],
    }
    return {"rows": rows, "summary": summary}


def engine_decode(
    out: str | Path = "out/verdicts-decode", regime: str = "decode", redundant: int = 2, rounds: int = 3, second: str = "fitted"
) -> dict:
    """advise's model against each server's own record window where passes are decode-sized (many
    experts, a few tokens a pass: weight reads per active slot count): a recording on the linear
    server, a fitted layout, then both servers alive and ``rounds`` rounds of a record window on
    each, back to back, the side that records first alternating (this machine's speed drifts between
    minutes: servers timed one after the other read it as a layout's effect). Per round, ``advise``
    on that round's linear window, its model's slowest ranks held to both windows' slowest rank
    means (``ErrorSplit.model_errors``) and its per-pass prices to both windows' critical paths
    measured pass by pass (``ErrorSplit.price_errors``); the targets are on their means over the rounds.
    ``second``: ``fitted`` (the candidate) or ``linear`` (the control: the linear placement as a layout)."""
    if rounds < 2:
        raise SystemExit("decode-sized check: at least 2 rounds")
    out, g = Path(out), DECODE_REGIMES[regime]
    _pin()
    rig = demo.prepare(out, g.skew, g.loads, "tp2", g.spec)
    rows = []
    linear = demo.serve(rig, "linear", demo.plugin_config(out / "dumps"))
    try:
        cand = demo.fit_and_advise(demo.record(linear, rig), redundant, out)
        if second == "linear":
            cand = _linear_candidate(cand, out)
        fitted = demo.serve(rig, "fitted", demo.plugin_config(out / "dumps", cand.path))
        servers = {"linear": linear, "fitted": fitted}
        try:
            for r in range(rounds):
                order = ("linear", "fitted") if r % 2 else ("fitted", "linear")
                got = {side: demo.record(servers[side], rig, f"{side}-{r + 1}") for side in order}
                rows.append(_decode_round(r + 1, cand, got["linear"], got["fitted"], g.spec))
        finally:
            fitted.stop()
    finally:
        linear.stop()
    splits = [row["split"] for row in rows if isinstance(row["split"], dict)]
    means = {
        "like for like (the model's slowest ranks at each window's load / its slowest rank means)": _means(
            splits, "model_errors"
        ),
        "per pass (advise's price / the critical path measured pass by pass)": _means(splits, "price_errors"),
        "the slowest rank means (advise's price / each window's slowest rank means, summed)": _means(splits, "mean_errors"),
    }
    # the slowest rank means are printed for comparison (what the issue measured), not held to the target:
    # a balanced layout's per-pass slowest rank is above its slowest rank mean by design
    within = {what: len(m) == 2 and all(abs(e) <= DECODE_TARGET for e in m.values()) for what, m in list(means.items())[:2]}
    print(f"decode-sized passes ({regime}), {len(splits)} of {rounds} rounds, the mean error over rounds:", flush=True)
    for what, m in means.items():
        target = "" if what not in within else f"; within {DECODE_TARGET:.0%} of both: {'met' if within[what] else 'MISSED'}"
        print(f"  {what}: running {_pct(m.get('now'))}, candidate {_pct(m.get('candidate'))}{target}", flush=True)
    return {"regime": regime, "rounds": rows, "mean_errors": means, "verdict": cand.advice.verdict, "within": within}


def _linear_candidate(fitted: demo.Candidate, out: Path) -> demo.Candidate:
    """The control's candidate: the linear placement (no redundant slot) of the fitted layout's model, written as a layout."""
    g = Geometry(fitted.layout.geometry.num_experts, 0, fitted.layout.geometry.ep_size)
    layout = Layout(linear_map(g, fitted.layout.num_layers), g, fitted.layout.moe_layers)
    return demo.Candidate(layout, write_layout(layout, out / "linear-layout.json"), fitted.advice)


def _means(splits: list[dict], key: str) -> dict[str, float]:
    """The mean over rounds of each side's error ``key`` (a side left out where a round lacks it)."""
    out = {}
    for side in ("now", "candidate"):
        values = [s[key][side] for s in splits if s[key][side] is not None]
        if values and len(values) == len(splits):
            out[side] = float(np.mean(values))
    return out


def _decode_round(r: int, cand: demo.Candidate, linear: demo.Recording, own: demo.Recording, spec: TinyMoeSpec) -> dict:
    """One round of the decode-sized check: advise on this round's linear window for the candidate,
    split against the candidate's window of the same round."""
    layers = len(cand.layout.moe_layers)
    window = TimingWindow.of_status(linear.status, "the linear server's status", layers)
    advice = advise(linear.counts, cand.layout, "static", window)
    split = _split(demo.Candidate(cand.layout, cand.path, advice), linear, own, None, own_passes=True)
    if not isinstance(split, ErrorSplit):
        print(f"round {r}: no split: {split}", flush=True)
        return {"round": r, "split": split, "verdict": advice.verdict}
    per_pass = split.tokens_now / spec.top_k
    print(f"round {r} ({spec.num_experts} experts, top-{spec.top_k}, {per_pass:.1f} tokens a pass):")
    for line in split.lines():
        print(f"  {line}", flush=True)
    means = {
        "now": split.critical_predicted_now / split.critical_measured_now - 1,
        "candidate": split.critical_predicted_candidate / split.critical_measured_candidate - 1,
    }
    print(
        f"  advise's price against the slowest rank means (the issue's yardstick): running {_pct(means['now'])}, "
        f"candidate {_pct(means['candidate'])}",
        flush=True,
    )
    return {
        "round": r,
        "split": {**split.to_dict(), "mean_errors": means},
        "verdict": advice.verdict,
        "reasons": list(advice.reasons),
    }


def _pin() -> None:
    """The API servers, engine cores and clients off the ranks' cores where the machine has spare ones."""
    host = pin_host(demo.RANK_CORES)
    print(f"host processes on cores {sorted(host)}" if host else "no core to spare: host processes share the ranks' cores")


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _print_simulated(s: dict) -> None:
    print(
        f"\n{s['cases']} cases: |predicted - truth| max {s['max_abs_error']:.4f}, mean {s['mean_abs_error']:.4f}; "
        f"|k=1 - k=16| max {s['max_k1_k16_gap']:.4f}; the mean pass's slowest rank (aggregate) over the truth: "
        f"max {s['aggregate_bias_max']:+.4f}, mean {s['aggregate_bias_mean']:+.4f}"
    )
    print(
        f"false trial on {s['under_floor_verdicts']} verdicts whose true gain is under the floor: "
        f"{_rate(s['false_trial_rate'])}; trial on {s['over_floor_verdicts']} above it: {_rate(s['trial_rate_over_floor'])}"
    )
    print(
        f"EP16 targets (k=1 vs k=16 < {TARGETS['k1_vs_k16']}, each < {TARGETS['vs_truth']} of the truth): "
        f"{'met' if s['ep16_targets_met'] else 'MISSED'}"
    )


def _print_engine(rows: list[dict]) -> None:
    print(
        "\n| skew | step + pause ms | advise | predicted (bound) | measured [95% CI] | predicted in CI | measured verdict "
        "| model's ratio x MoE x outside x batch = windows' ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ci, s = r["measured_ci"], r["split"]
        split = (
            f"{s['predicted']:.3f} x {s['moe']:.3f} x {s['outside']:.3f} x {s['batch']:.3f} = {s['windows']:.3f}"
            if isinstance(s, dict)
            else f"n/a ({s})"
        )
        print(
            f"| {r['skew']} | {_num(r['step_ms'])} + {_num(r['gap_ms'])} | {r['verdict']} | {_num(r['predicted'])} "
            f"({_num(r['bound'])}) | {r['measured']:.3f} [{_num(ci[0] if ci else None)}, {_num(ci[1] if ci else None)}] | "
            f"{r['predicted_in_ci']} | {r['measured_verdict']} | {split} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DEFAULT, help="folder of the sample counts files")
    ap.add_argument("--json", help="write the rows and the summary here")
    ap.add_argument("--quick", action="store_true", help="one prefill and the decode scene only")
    ap.add_argument("--noise", type=float, default=NOISE, help=f"timing measurement noise, relative sd (default {NOISE})")
    ap.add_argument(
        "--engine",
        choices=("no", "also", "only", "decode"),
        default="no",
        help="the engine calibration (starts two vLLM servers per skew, ~7 min each): no (default), also, only; "
        "decode: only the decode-sized check of the model on both servers' windows (~5 min)",
    )
    ap.add_argument("--out", default="out/verdicts-engine", help="the engine calibration's working folder")
    ap.add_argument(
        "--second",
        choices=("fitted", "linear"),
        default="fitted",
        help="decode: the second server runs the fitted layout (default) or, as the control, the linear placement as a layout",
    )
    ap.add_argument(
        "--regime",
        choices=sorted(DECODE_REGIMES),
        default="decode",
        help="decode: the decode-sized check's model and load: decode (issue 37's, skew 0.5, 32-token prompts, "
        "48 output tokens) or short (issue 47's: 1024-wide experts, skew 1, 6-token prompts, 6 output tokens)",
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="engine calibration: alternating rounds per skew (>= 3); decode: rounds (>= 2)"
    )
    ap.add_argument("--num-prompts", type=int, default=600, help="engine calibration: requests per measured run")
    ap.add_argument("--skews", type=float, nargs="+", default=list(SKEWS), help="engine calibration: router skews")
    a = ap.parse_args()
    doc: dict = {}
    ok = True
    if a.engine not in ("only", "decode"):
        doc["advise"] = advise_calibration(a.data, quick=a.quick, noise=a.noise)
        _print_simulated(doc["advise"]["summary"])
        ok = doc["advise"]["summary"]["ep16_targets_met"]
    if a.engine in ("also", "only"):
        doc["engine"] = engine_calibration(a.out, tuple(a.skews), a.repeats, a.num_prompts)
        _print_engine(doc["engine"]["rows"])
    if a.engine == "decode":
        doc["decode"] = engine_decode(a.out, a.regime, rounds=a.repeats, second=a.second)
        ok = ok and all(doc["decode"]["within"].values())
    if a.json:
        atomic_write_bytes(Path(a.json), json.dumps(doc, indent=2).encode())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
