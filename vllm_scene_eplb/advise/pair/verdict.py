"""The pair's advice (``pair_advise``): the gates, the fitted model, the predictions with their
intervals and the verdict, and the binding side, each in words. Pure numpy."""

from __future__ import annotations

import math

import numpy as np

from ...errors import SceneEplbError
from ...protocol.pair import PairAdvice, PairPrediction
from ..gates import NOISE_FLOOR
from .gates import INTERVAL_TAIL, check_draws, evidence_gate
from .inputs import NodeEffect, NodeWindow, PairLoad
from .model import d_token_ratio, fitted
from .prediction import elasticities, layouts, node_ratios, ratio
from .solver import Network, open_throughput, solve

DEFAULT_ELASTICITY = 0.5  # the decode step's elasticity in the batch the interval spans, from 0
DEFAULT_DRAWS = 200


def pair_advise(
    p: NodeWindow,
    d: NodeWindow,
    load: PairLoad,
    p_effect: NodeEffect | None,
    d_effect: NodeEffect | None,
    elasticity: float = DEFAULT_ELASTICITY,
    draws: int = DEFAULT_DRAWS,
    seed: int = 0,
) -> PairAdvice:
    """The pair's advice (``protocol.PairAdvice``) for a layout on P (``p_effect``), on D
    (``d_effect``) or both: the point at a flat decode step (elasticity 0), the interval the 2.5 and
    97.5 percentiles of ``draws`` draws of the bench's requests (resampled), the node ratios (uniform
    over their intervals) and the decode elasticity (uniform in [0, ``elasticity``]) give."""
    check_draws(elasticity, draws, seed)
    if p_effect is None and d_effect is None:
        raise SceneEplbError("no layout to price: give --p-advice or --p-step-ratio, --d-advice or --d-step-ratio")
    kind = "closed" if load.closed else "open"
    assumptions = ASSUMPTIONS[kind]
    net, fit = fitted(p, d, load, 0.0)
    gate = evidence_gate(p, d, load, net, fit)
    details = _figures(p, d, load, net, fit)
    if gate:
        return PairAdvice("insufficient_evidence", kind, None, (), tuple(gate), assumptions, details)
    r_d_point = 1.0 if d_effect is None else d_token_ratio(d_effect.ratio, d, net.tau)
    r_p_point = 1.0 if p_effect is None else p_effect.ratio
    rng = np.random.default_rng(seed)
    samples = {k: [] for k in layouts(p_effect, d_effect)}  # type: dict[str, list[float]]
    for _ in range(draws):
        drawn_load = load.resampled(rng)
        drawn, _ = fitted(p, d, drawn_load, float(rng.uniform(0, elasticity)))
        r_p = 1.0 if p_effect is None else p_effect.draw(rng)
        r_d = 1.0 if d_effect is None else d_token_ratio(d_effect.draw(rng), d, drawn.tau)
        for k in samples:
            samples[k].append(ratio(drawn, drawn_load, *node_ratios(k, r_p, r_d)))
    preds = []
    for k, got in samples.items():
        point = ratio(net, load, *node_ratios(k, r_p_point, r_d_point))
        low, high = (float(np.percentile(got, q)) for q in (INTERVAL_TAIL, 100 - INTERVAL_TAIL))
        low, high = min(low, point), max(high, point)
        node_p = p_effect.ratio if p_effect and k != "d" else None
        node_d = d_effect.ratio if d_effect and k != "p" else None
        preds.append(PairPrediction(k, node_p, node_d, point, low, high, "trial" if low - 1 >= NOISE_FLOOR else "skip"))
    binding, why = _binding(net, load, p, d)
    reasons = [why, *(_prediction_line(x) for x in preds)]
    verdict = "trial" if any(x.verdict == "trial" for x in preds) else "skip"
    details = {**details, "elasticity_range": [0.0, elasticity], "draws": draws}
    return PairAdvice(verdict, kind, binding, tuple(preds), tuple(reasons), assumptions, details)


def _binding(net: Network, load: PairLoad, p: NodeWindow, d: NodeWindow) -> tuple[str, str]:
    """What binds and why in words: the side whose speed-up moves the throughput most; the rest of
    the cycle (handoff and clients, or the offered rate) where neither does."""
    e_p, e_d = elasticities(net, load)
    if load.closed:
        sol = solve(net, load.clients)
        cycle = load.clients / sol.x
        rest = max(0.0, 1.0 - e_p - e_d)
        shares = {"prefill": e_p, "decode": e_d}
        shares["handoff"] = rest * net.handoff_s / max(1e-12, net.handoff_s + net.client_s)
        shares["clients"] = rest - shares["handoff"]
        side = max(shares, key=lambda k: shares[k])
        util, batch = sol.p_utilization, sol.d_batch
    else:
        _, side = open_throughput(net, load.rate, load.concurrency)
        cycle = math.nan
        util, batch = load.throughput * net.s_p / net.p_engines, d.flow.running_mean
    fp, fd = p.flow, d.flow
    evidence = (
        f"P busy {fp.busy_share:.0%} of its window (model {util:.0%}); D's batch {fd.running_mean:.1f} of "
        f"{fd.max_num_seqs} per engine (model {batch:.1f}), short steps {_share(fd.short_steps_share)}, "
        f"waiting {fd.waiting_mean:.1f}; the handoff {1000 * net.handoff_s:.1f} ms"
        + ("" if math.isnan(cycle) else f" of a {1000 * cycle:.0f} ms cycle")
        + f"; elasticity of the pair's throughput in P's speed {e_p:.2f}, in D's {e_d:.2f}"
    )
    story = {
        "prefill": "P binds: P busy and D starved" if (fd.short_steps_share or 0) > 0.5 else "P binds",
        "decode": "D binds: D full and P idle" if fd.batch_share > 0.9 else "D binds: decode time is most of the cycle",
        "handoff": "the KV handoff binds: neither node's speed moves the throughput much",
        "clients": "the clients' own time binds: neither node's speed moves the throughput much",
        "offered_load": "the offered rate binds: both nodes keep up, so a layout changes latency, not throughput",
    }[side]
    return side, f"{story} ({evidence})"


def _share(v: float | None) -> str:
    return "not measured" if v is None else f"{v:.0%}"


def _prediction_line(pred: PairPrediction) -> str:
    on = {"p": "a P layout", "d": "a D layout", "both": "both layouts"}[pred.layout]
    nodes = ", ".join(
        f"{side} node ratio {r:.3f}" for side, r in (("P", pred.node_ratio_p), ("D", pred.node_ratio_d)) if r is not None
    )
    return (
        f"{on} ({nodes}): predicted pair output throughput ratio {pred.ratio:.3f} "
        f"[{pred.low:.3f}, {pred.high:.3f}]: {pred.verdict}"
    )


def _figures(p: NodeWindow, d: NodeWindow, load: PairLoad, net: Network, fit: float) -> dict:
    """The numbers behind the advice, by name (seconds as ms)."""
    sol = solve(net, load.clients) if load.closed else None
    return {
        "clients": load.clients if load.closed else load.concurrency,
        "rate": None if load.closed else load.rate,
        "measured_requests_per_s": load.throughput,
        "p_service_ms": 1000 * net.s_p,
        "p_engines": net.p_engines,
        "p_capacity_per_s": net.capacity_p,
        "handoff_ms": 1000 * net.handoff_s,
        "client_ms": 1000 * net.client_s,
        "tpot_ms": 1000 * net.tau,
        "tpot_ms_of_d_window": 1000 * d.flow.running_mean * d.engines / max(d.flow.generated_tokens_per_s, 1e-12),
        "decode_tokens": net.decode_tokens,
        "d_engines": net.d_engines,
        "d_max_num_seqs": net.d_max,
        "d_batch_measured": net.b_ref,
        "d_capacity_per_s": net.capacity_d,
        "model_over_measured_without_clients": fit,
        "model_latency_ms": None if sol is None else 1000 * (load.clients / sol.x - net.client_s),
        "measured_latency_ms": 1000 * float(load.latency_s.mean()),
        "model_residence_ms": None if sol is None else {k: 1000 * v for k, v in sol.residence_s.items()},
        "model_d_batch": None if sol is None else sol.d_batch,
        "model_p_utilization": None if sol is None else sol.p_utilization,
    }


_COMMON = (
    "P's engines serve one request at a time at a rate batching does not raise (prefill is compute-bound); "
    "its service per request is its busy share (with the pause between busy steps) over its prefill completions per engine",
    "the KV handoff is a delay no layout changes: D's arrival-to-first-token less the admission wait D's queue explains",
    "D's step time is flat in the batch below max_num_seqs (memory-bound decode) at the point; the interval "
    "lets it rise with the batch at an elasticity up to the one given",
    "a layout divides P's service, or D's time per token by the share of its busy cycle it saves (the node ratio); "
    "the same requests (lengths) come in",
    "the nodes' windows and the bench are of one load in its steady state; the interval carries the bench's "
    "per-request spread and the node ratios' intervals, not the windows' own noise",
)
ASSUMPTIONS = {
    "closed": (
        *_COMMON,
        "closed loop: each client sends its next request when its reply ends, after its own time, fitted so that "
        "the model reproduces the measured throughput and kept for the candidate",
        "product form (exponential P service, processor-sharing D, delays): mean throughput exact, queues approximate",
    ),
    "open": (
        *_COMMON,
        "open loop: throughput is the offered rate while both nodes (and any concurrency cap) keep up; a layout "
        "then changes latency only, and only at saturation does the binding capacity's ratio carry over",
    ),
}
