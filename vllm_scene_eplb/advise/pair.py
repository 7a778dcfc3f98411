"""The P/D pair: what a layout on the prefill node (P), the decode node (D) or both does to the whole
pair's output throughput under a measured load (``pair_advise``). Pure numpy.

Each request of a closed loop of C clients visits four stations once per cycle:

- P, ``p_engines`` parallel servers (its DP engines), each busy ``s_p`` seconds per request (the
  utilization law on P's window: its busy share, with the pause between busy steps, over its prefill
  completions per engine). Prefill is compute-bound, so batching prompts does not raise an engine's
  rate: mu_P(n) = min(n, p_engines) / s_p requests per second with n requests at P;
- the handoff, a delay of ``handoff_s``: D's arrival-to-first-token (the KV pull and admission) less
  the admission wait D's own queue explains (that wait is D's station's, below);
- D, a batching station: with n requests decoding on ``d_engines`` engines of ``d_max`` sequences,
  b = min(n, d_engines x d_max) / d_engines per engine, every step takes tau(b) seconds and gives
  each of them a token, so mu_D(n) = d_engines x b / (decode_tokens x tau(b)); tau(b) = tau x (1 +
  elasticity x (b / b_ref - 1)): flat in the batch at elasticity 0 (memory-bound decode), throughput
  flat in the batch at 1 (compute-bound), ``tau`` the bench's time per output token at D's measured
  batch ``b_ref``;
- the clients, a delay of ``client_s``: fitted so that the model reproduces the measured throughput.

The network is product form (BCMP: P as load-dependent exponential FCFS, D as load-dependent
processor sharing, the delays infinite servers), solved exactly by the normalizing constant
(Buzen's convolution, in logs: the numbers exact MVA gives, without its loss of precision with two
load-dependent stations): X(C) = G(C-1) / G(C). A layout divides ``s_p`` or ``tau`` by its node
ratio; the pair's predicted ratio is X'(C) / X(C) under one model with the same ``client_s``.

An open load at rate lambda is served at min(lambda, P's capacity, D's capacity, the concurrency
cap's closed-loop throughput): below every capacity the ratio is 1 (the layout changes latency only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import SceneEplbError
from ..protocol import Advice, FlowView, StatusAnswer
from ..protocol.fields import _is_number
from ..protocol.pair import PAIR_LAYOUTS, PairAdvice, PairPrediction
from .gates import NOISE_FLOOR

CALIBRATION_TOLERANCE = 0.10  # the model at no client time may fall this short of the measured throughput
WINDOW_AGREEMENT = 0.30  # a node's window rate may differ this much from the bench's before it is refused
SATURATED = 0.95  # an open load served below this share of its rate fell behind it
DEFAULT_ELASTICITY = 0.5  # the decode step's elasticity in the batch the interval spans, from 0
DEFAULT_DRAWS = 200
INTERVAL_TAIL = 2.5  # percent of the draws beyond each end of the interval (a 95% interval)
MIN_DRAWS = math.ceil(100 / INTERVAL_TAIL)  # 40: the fewest that put a draw, on average, beyond each end
MAX_DRAWS = 100_000  # each draw refits the network (about 3 ms at 32 clients): minutes at most
ELASTICITY_STEP = 1.01  # the node ratio an elasticity dlnX/dln r is taken at


# --- the inputs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeWindow:
    """One node's window from its status answer: its ``flow``, DP ``engines`` and the live window's
    mean ``step_ms`` and ``gap_ms`` (None: not timed)."""

    flow: FlowView
    engines: int
    step_ms: float | None
    gap_ms: float | None

    @classmethod
    def of(cls, status: StatusAnswer, side: str, source: str | None) -> NodeWindow:
        """The window of the ``side`` ("P" or "D") node, refused with one line naming what is missing."""
        wrong = "decode" if side == "P" else "prefill"
        if status.status.role == wrong:
            raise SceneEplbError(f"the {side} node's status says role={wrong}: is it the other node?", source)
        flow = status.flow
        if flow is None:
            raise SceneEplbError(
                f"the {side} node's status has no flow (vLLM's stats off, or a plugin older than this client): "
                "start it with stats on (no --disable-log-stats) and take its status during the bench",
                source,
            )
        if flow.steps == 0:
            raise SceneEplbError(f"the {side} node's flow saw no engine step in its {flow.window_s:g} s window", source)
        time = None if status.live is None else status.live.time
        step, gap = (None, None) if time is None else (time.step_ms, time.gap_ms)
        return cls(flow, len({r.dp_rank for r in status.ranks}), step, gap)

    @property
    def cycle_s(self) -> float | None:
        """A busy step's cycle (step and the pause before the next) in seconds, None when not timed."""
        return None if not self.step_ms else (self.step_ms + (self.gap_ms or 0.0)) / 1000.0


@dataclass(frozen=True)
class PairLoad:
    """The bench's load: per successful request [n] its time to first token and latency (s) and its
    output tokens; the measured throughput (requests/s, over the steady window where one exists),
    the concurrency cap (None: none) and the request rate (inf: all at once)."""

    ttft_s: np.ndarray
    latency_s: np.ndarray
    output_lens: np.ndarray
    throughput: float
    concurrency: int | None
    rate: float

    @property
    def closed(self) -> bool:
        return math.isinf(self.rate)

    @property
    def clients(self) -> int:
        """The closed loop's population: the cap, at most the requests sent (all of them without a cap)."""
        n = len(self.output_lens)
        return n if self.concurrency is None else min(self.concurrency, n)

    def tau(self) -> float:
        """Seconds per output token after the first, token-weighted over the requests."""
        many = self.output_lens >= 2
        return float((self.latency_s - self.ttft_s)[many].sum() / (self.output_lens[many] - 1).sum())

    def resampled(self, rng: np.random.Generator) -> PairLoad:
        """The load's requests drawn with replacement; a closed loop's throughput scaled by the mean
        latency's change (C / X = latency + the clients' time, which stays)."""
        idx = rng.integers(0, len(self.output_lens), len(self.output_lens))
        lat = self.latency_s[idx]
        if (self.output_lens[idx] < 2).all():
            idx, lat = np.arange(len(self.output_lens)), self.latency_s
        x = self.throughput
        if self.closed:
            cycle = self.clients / x
            x = self.clients / max(1e-12, cycle - float(self.latency_s.mean()) + float(lat.mean()))
        return replace(self, ttft_s=self.ttft_s[idx], latency_s=lat, output_lens=self.output_lens[idx], throughput=x)


@dataclass(frozen=True)
class NodeEffect:
    """A candidate's effect on one node: its throughput ratio over a busy cycle (candidate / running,
    > 1 faster) with an interval, and where it came from."""

    ratio: float
    low: float
    high: float
    source: str

    def __post_init__(self) -> None:
        if not (0 < self.low <= self.ratio <= self.high < math.inf):
            raise SceneEplbError(
                f"{self.source}: the node ratio {self.ratio} must lie in its interval [{self.low}, {self.high}], all > 0"
            )

    @classmethod
    def of_step_ratio(cls, ratio: float, low: float, high: float, node: NodeWindow, source: str) -> NodeEffect:
        """A plain step-time ratio (old step / new step) as a cycle ratio: the pause between steps,
        which no layout changes, stays (without a timed step the step is the whole cycle)."""
        if not node.step_ms:
            return cls(ratio, low, high, f"{source} (no timed step: taken as the whole cycle)")
        step, gap = node.step_ms, node.gap_ms or 0.0

        def cycle(r: float) -> float:
            return (step + gap) / (step / r + gap)

        return cls(cycle(ratio), cycle(low), cycle(high), f"{source} (step {step:.2f} ms + pause {gap:.2f} ms)")

    @classmethod
    def of_advice(cls, advice: Advice, source: str) -> NodeEffect:
        """A node's ``advise`` answer: its predicted ratio, the interval its own figures span (the
        ratio on each half of the recording, and at the other end of an unidentified slot cost)."""
        if advice.verdict == "insufficient_evidence" or advice.predicted_throughput_ratio is None:
            raise SceneEplbError(f"the advice is {advice.verdict}: it pins no node ratio down", source)
        ratio = advice.predicted_throughput_ratio
        halves = advice.details.get("halves", [])
        bound = advice.details.get("bound_ratio")
        spread = [ratio, *(halves if isinstance(halves, list) else [None]), *([] if bound is None else [bound])]
        if not all(_is_number(v, 1e-9) for v in spread):
            raise SceneEplbError("the advice's details halves and bound_ratio must be finite numbers > 0", source)
        return cls(ratio, min(spread), max(spread), f"{source} (advise: {advice.verdict})")

    def draw(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high)) if self.high > self.low else self.ratio


# --- the network ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Network:
    """The pair as a closed network, in seconds and requests (the module's docstring)."""

    s_p: float
    p_engines: int
    handoff_s: float
    client_s: float
    tau: float
    decode_tokens: float
    d_engines: int
    d_max: int
    b_ref: float
    elasticity: float = 0.0

    def scaled(self, r_p: float = 1.0, r_d: float = 1.0) -> Network:
        """The network with P's service and D's time per token divided by their ratios."""
        return replace(self, s_p=self.s_p / r_p, tau=self.tau / r_d)

    def p_rates(self, n: int) -> np.ndarray:
        """mu_P(j) for j = 1..n [n], requests/s."""
        return np.minimum(np.arange(1, n + 1), self.p_engines) / self.s_p

    def d_rates(self, n: int) -> np.ndarray:
        """mu_D(j) for j = 1..n [n], requests/s."""
        b = np.minimum(np.arange(1, n + 1), self.d_engines * self.d_max) / self.d_engines
        return self.d_engines * b / (self.decode_tokens * self.step_s(b))

    def step_s(self, b):
        """tau(b): D's seconds per step at ``b`` sequences per engine (array or float)."""
        return self.tau * np.maximum(1e-9, 1 + self.elasticity * (b / self.b_ref - 1))

    @property
    def capacity_p(self) -> float:
        return self.p_engines / self.s_p

    @property
    def capacity_d(self) -> float:
        return float(self.d_rates(self.d_engines * self.d_max)[-1])


def _log_f(rates: np.ndarray) -> np.ndarray:
    """A load-dependent station's log f(j) = -sum_{i<=j} log mu(i), j = 0..n [n+1]."""
    return np.concatenate([[0.0], -np.cumsum(np.log(rates))])


def _log_delay(demand: float, n: int) -> np.ndarray:
    """A delay station's log f(j) = log(demand^j / j!), j = 0..n [n+1]."""
    j = np.arange(n + 1)
    if demand <= 0:
        return np.where(j == 0, 0.0, -np.inf)
    return j * math.log(demand) - np.array([math.lgamma(k + 1) for k in j])


def _log_sum(v: np.ndarray) -> float:
    top = float(np.max(v))
    return top if top == -math.inf else top + math.log(float(np.exp(v - top).sum()))


def _log_conv(a: np.ndarray, b: np.ndarray, rows: int = 256) -> np.ndarray:
    """log of the convolution of exp(a) and exp(b), both [n+1]: the normalizing constant of two
    stations, out[k] = log sum_i exp(a[i] + b[k - i]), ``rows`` values of k at a time."""
    n = len(a)
    out = np.empty(n)
    i = np.arange(n)
    for start in range(0, n, rows):
        k = np.arange(start, min(n, start + rows))[:, None]
        terms = np.where(i <= k, a[i] + b[np.clip(k - i, 0, None)], -np.inf)
        top = terms.max(axis=1)
        safe = np.where(np.isfinite(top), top, 0.0)
        with np.errstate(divide="ignore"):
            out[k[:, 0]] = safe + np.log(np.exp(terms - safe[:, None]).sum(axis=1))
    return out


@dataclass(frozen=True)
class Solution:
    """The network at C clients: throughput ``x`` (requests/s), P's utilization per engine, D's mean
    batch per engine and each station's mean residence (s) per visit."""

    x: float
    p_utilization: float
    d_batch: float
    residence_s: dict


def _throughput(g_pd: np.ndarray, delay: float, c: int) -> float:
    """X(C) = G(C-1) / G(C) from P and D's joint constant [C+1] and the delays' total demand."""
    d = _log_delay(delay, c)
    log_c = _log_sum(g_pd + d[::-1])
    log_c1 = _log_sum(g_pd[:c] + d[c - 1 :: -1])
    return math.exp(log_c1 - log_c)


def throughput(net: Network, c: int) -> float:
    """The closed loop's throughput at ``c`` clients, requests/s."""
    return _throughput(_log_conv(_log_f(net.p_rates(c)), _log_f(net.d_rates(c))), net.handoff_s + net.client_s, c)


def solve(net: Network, c: int) -> Solution:
    """Throughput, P's utilization, D's batch and the residences at ``c`` clients."""
    fp, fd, fz = _log_f(net.p_rates(c)), _log_f(net.d_rates(c)), _log_delay(net.handoff_s + net.client_s, c)
    g = _log_sum(_log_conv(fp, fd) + fz[::-1])
    x = throughput(net, c)
    j = np.arange(c + 1)
    p_at_p = np.exp(fp + _log_conv(fd, fz)[::-1] - g)  # P(j requests at P), j = 0..C
    p_at_d = np.exp(fd + _log_conv(fp, fz)[::-1] - g)
    n_p, n_d = float((j * p_at_p).sum()), float((j * p_at_d).sum())
    batch = float((np.minimum(j, net.d_engines * net.d_max) * p_at_d).sum()) / net.d_engines
    return Solution(
        x,
        x * net.s_p / net.p_engines,
        batch,
        {"prefill": n_p / x, "handoff": net.handoff_s, "decode": n_d / x, "clients": net.client_s},
    )


def calibrate(net: Network, c: int, measured: float) -> tuple[Network, float]:
    """The network with the clients' time that reproduces ``measured`` throughput at ``c`` clients
    (bisection: X falls with the delay), and the model's throughput with no client time over the
    measured one (below 1: the windows explain less throughput than was measured; the time is 0)."""
    g_pd = _log_conv(_log_f(net.p_rates(c)), _log_f(net.d_rates(c)))
    top = _throughput(g_pd, net.handoff_s, c)
    if top <= measured:
        return replace(net, client_s=0.0), top / measured
    lo, hi = 0.0, c / measured
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _throughput(g_pd, net.handoff_s + mid, c) > measured else (lo, mid)
    return replace(net, client_s=(lo + hi) / 2), top / measured


def open_throughput(net: Network, rate: float, cap: int | None) -> tuple[float, str]:
    """An open load's throughput and what binds it: the rate, P's or D's capacity, or the
    concurrency cap's closed loop (no client time)."""
    bounds = {"offered_load": rate, "prefill": net.capacity_p, "decode": net.capacity_d}
    if cap is not None:
        bounds["clients"] = throughput(replace(net, client_s=0.0), cap)
    side = min(bounds, key=lambda k: bounds[k])
    return bounds[side], side


def load_throughput(net: Network, load: PairLoad) -> float:
    """The load's throughput under ``net``: the closed loop's at its clients, or the open one's."""
    return throughput(net, load.clients) if load.closed else open_throughput(net, load.rate, load.concurrency)[0]


# --- from the windows to the network ------------------------------------------------------------


def network(p: NodeWindow, d: NodeWindow, load: PairLoad, elasticity: float = 0.0) -> Network:
    """The network the two windows and the bench give (no client time yet: ``calibrate``)."""
    fp, fd = p.flow, d.flow
    if fp.busy_share is None:
        raise SceneEplbError("the P node's flow has no busy_share: start it with scene_eplb.time_moe true")
    if fp.prefill_completions_per_s <= 0 or fp.busy_share <= 0:
        raise SceneEplbError("the P node's window prefilled nothing: take its status while the bench runs")
    if fd.running_mean <= 0 or fd.first_token_ms is None:
        raise SceneEplbError("the D node's window decoded nothing: take its status while the bench runs")
    occupancy = fp.busy_share
    if p.step_ms:  # the pause between busy steps is P's too: a busy P pays step and pause
        occupancy = min(1.0, fp.busy_share * (p.step_ms + (p.gap_ms or 0.0)) / p.step_ms)
    admission = max(0.0, fd.waiting_mean - fd.kv_fetching_mean) * d.engines / max(fd.finished_per_s, 1e-12)
    return Network(
        s_p=occupancy * p.engines / fp.prefill_completions_per_s,
        p_engines=p.engines,
        handoff_s=max(0.0, fd.first_token_ms / 1000.0 - admission),
        client_s=0.0,
        tau=load.tau(),
        decode_tokens=float((load.output_lens - 1).clip(0).mean()),
        d_engines=d.engines,
        d_max=fd.max_num_seqs,
        b_ref=fd.running_mean,
        elasticity=elasticity,
    )


def d_token_ratio(ratio: float, d: NodeWindow, tau: float) -> float:
    """D's time per output token, now over with the candidate, from its cycle ratio ``ratio``: the
    cycle's saved time comes off each token (a TPOT longer than D's cycle keeps the rest); without
    a timed cycle, or one longer than the TPOT, the TPOT itself scales."""
    cycle = d.cycle_s
    if cycle is None or cycle > tau:
        return ratio
    return tau / max(1e-12, tau - cycle * (1 - 1 / ratio))


# --- the advice -------------------------------------------------------------------------------


def _ratio(net: Network, load: PairLoad, r_p: float, r_d: float) -> float:
    return load_throughput(net.scaled(r_p, r_d), load) / load_throughput(net, load)


def _fitted(p: NodeWindow, d: NodeWindow, load: PairLoad, elasticity: float) -> tuple[Network, float]:
    net = network(p, d, load, elasticity)
    return calibrate(net, load.clients, load.throughput) if load.closed else (net, 1.0)


def _layouts(p_effect: NodeEffect | None, d_effect: NodeEffect | None) -> list[str]:
    return [k for k, on in zip(PAIR_LAYOUTS, (p_effect, d_effect, p_effect and d_effect)) if on]


def _node_ratios(layout: str, r_p: float, r_d: float) -> tuple[float, float]:
    return (r_p if layout in ("p", "both") else 1.0, r_d if layout in ("d", "both") else 1.0)


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
    _check_draws(elasticity, draws, seed)
    if p_effect is None and d_effect is None:
        raise SceneEplbError("no layout to price: give --p-advice or --p-step-ratio, --d-advice or --d-step-ratio")
    kind = "closed" if load.closed else "open"
    assumptions = ASSUMPTIONS[kind]
    net, fit = _fitted(p, d, load, 0.0)
    gate = _evidence_gate(p, d, load, net, fit)
    details = _figures(p, d, load, net, fit)
    if gate:
        return PairAdvice("insufficient_evidence", kind, None, (), tuple(gate), assumptions, details)
    r_d_point = 1.0 if d_effect is None else d_token_ratio(d_effect.ratio, d, net.tau)
    r_p_point = 1.0 if p_effect is None else p_effect.ratio
    rng = np.random.default_rng(seed)
    samples = {k: [] for k in _layouts(p_effect, d_effect)}  # type: dict[str, list[float]]
    for _ in range(draws):
        drawn_load = load.resampled(rng)
        drawn, _ = _fitted(p, d, drawn_load, float(rng.uniform(0, elasticity)))
        r_p = 1.0 if p_effect is None else p_effect.draw(rng)
        r_d = 1.0 if d_effect is None else d_token_ratio(d_effect.draw(rng), d, drawn.tau)
        for k in samples:
            samples[k].append(_ratio(drawn, drawn_load, *_node_ratios(k, r_p, r_d)))
    preds = []
    for k, got in samples.items():
        point = _ratio(net, load, *_node_ratios(k, r_p_point, r_d_point))
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


def _check_draws(elasticity: float, draws: int, seed: int) -> None:
    """The interval's options, refused in one line: an elasticity in [0, 1] (flat to proportional),
    enough draws for the interval's ends (``MIN_DRAWS``), a seed numpy takes."""
    if not 0 <= elasticity <= 1:
        raise SceneEplbError(f"the decode elasticity must be in [0, 1] (0: flat, 1: proportional), got {elasticity!r}")
    if isinstance(draws, bool) or not isinstance(draws, int) or not MIN_DRAWS <= draws <= MAX_DRAWS:
        raise SceneEplbError(
            f"draws must be an integer in [{MIN_DRAWS}, {MAX_DRAWS}] (a {100 - 2 * INTERVAL_TAIL:g}% interval's ends "
            f"need {MIN_DRAWS}), got {draws!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SceneEplbError(f"the draws' seed must be an integer >= 0, got {seed!r}")


def elasticities(net: Network, load: PairLoad) -> tuple[float, float]:
    """dlnX / dln r of P's and of D's node ratio at the running layouts."""
    step = math.log(ELASTICITY_STEP)
    return (
        math.log(_ratio(net, load, ELASTICITY_STEP, 1.0)) / step,
        math.log(_ratio(net, load, 1.0, ELASTICITY_STEP)) / step,
    )


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


def _evidence_gate(p: NodeWindow, d: NodeWindow, load: PairLoad, net: Network, fit: float) -> list[str]:
    """Why the windows and the bench do not describe one load (empty: they do)."""
    why = []
    for side, rate, what in (
        ("P", p.flow.prefill_completions_per_s, "prefill completions"),
        ("D", d.flow.finished_per_s, "finished requests"),
    ):
        if abs(rate / load.throughput - 1) > WINDOW_AGREEMENT:
            why.append(
                f"the {side} node's window saw {rate:.3g} {what}/s, the bench {load.throughput:.3g} requests/s: "
                "take both statuses while the bench runs, in its steady state"
            )
    if load.closed and fit < 1 - CALIBRATION_TOLERANCE:
        why.append(
            f"the windows explain {fit:.0%} of the measured throughput with no client time: P's busy share, "
            "D's handoff or the bench's TPOT are not of one load"
        )
    if not load.closed and load.throughput < SATURATED * load.rate:
        _, side = open_throughput(net, load.rate, load.concurrency)
        if side == "offered_load":
            why.append(
                f"the bench served {load.throughput:.3g} of {load.rate:.3g} requests/s offered, yet the model "
                "has capacity above the rate: the windows miss what held it back"
            )
    return why


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
