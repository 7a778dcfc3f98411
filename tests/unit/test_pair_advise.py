"""`pair-advise` (issue 38 item 2): the P/D pair as a closed network, against hand-computable cases and
an exact CTMC; a P-bound load predicts the P node's ratio, a D-bound one ~1 for a P layout; an open load
below capacity predicts 1; the binding side named; hostile input refused in one line; the CLI end to
end on saved files."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from vllm_scene_eplb.ab.results import closed_loop_rate, read_vllm_result
from vllm_scene_eplb.advise.pair import (
    MAX_DRAWS,
    MIN_DRAWS,
    NodeEffect,
    NodeWindow,
    PairLoad,
    calibrate,
    network,
    open_throughput,
    pair_advise,
    solve,
    throughput,
)
from vllm_scene_eplb.advise.pair import Network as Net
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.protocol import FlowView, StatusAnswer
from vllm_scene_eplb.protocol.pair import PairAdvice

from .test_bad_input import assert_one_line_error, run
from .test_protocol import status_with_time

# --- a synthetic pair: a known network, the windows and the bench it would give ----------------


@dataclasses.dataclass(frozen=True)
class Truth:
    """A pair's true parameters (ms, tokens, clients); ``rate`` inf: a closed loop."""

    prefill_ms: float = 20.0
    tpot_ms: float = 10.0
    out: int = 65
    clients: int = 8
    handoff_ms: float = 5.0
    client_ms: float = 2.0
    d_max: int = 16
    rate: float = math.inf
    requests: int = 400

    def network(self) -> Net:
        return Net(
            self.prefill_ms / 1000,
            1,
            self.handoff_ms / 1000,
            self.client_ms / 1000,
            self.tpot_ms / 1000,
            self.out - 1,
            1,
            self.d_max,
            1.0,
        )


def _flow(**fields) -> dict:
    """A flow of 3000 steps, every rate and mean 0, ``fields`` changed."""
    base = {f.name: 0.0 for f in dataclasses.fields(FlowView)}
    base.update(window_s=30.0, steps=3000, waiting_now=0, running_now=0, max_num_seqs=16)
    base.update(first_token_ms=None, short_steps_share=None, busy_share=None)
    return FlowView(**{**base, **fields}).to_wire()


def pair_case(t: Truth, seed: int = 0) -> tuple[dict, dict, dict]:
    """The P and D status answers and the bench result ``t`` gives (the network solved at its clients,
    or its open rate; D's queue wait in the first token, as a real D admits)."""
    net = t.network()
    if math.isinf(t.rate):
        sol = solve(net, t.clients)
        x, util, batch = sol.x, sol.p_utilization, sol.d_batch
        res_p = sol.residence_s["prefill"]
        wait_d = max(0.0, sol.residence_s["decode"] - net.decode_tokens * net.tau)
    else:
        x = min(t.rate, net.capacity_p, net.capacity_d)
        util = x * net.s_p
        batch = min(t.d_max, x * net.decode_tokens * net.tau)
        res_p, wait_d = net.s_p / max(1e-9, 1 - util), 0.0
    p_status = status_with_time(step_ms=10.0, gap_ms=0.0)
    p_status["flow"] = _flow(
        prefill_completions_per_s=x, busy_share=min(1.0, util), running_mean=min(util, 1.0), first_token_ms=1000 * res_p
    )
    d_status = status_with_time(step_ms=t.tpot_ms, gap_ms=0.0)
    for r in d_status["ranks"]:
        r["role"] = "decode"
    d_status["role"] = "decode"
    for doc in (p_status, d_status):  # one engine of TP 2 (the network's one P and one D engine)
        for i, r in enumerate(doc["ranks"]):
            r["dp_rank"], r["tp_rank"] = 0, i
    d_status["flow"] = _flow(
        finished_per_s=x,
        generated_tokens_per_s=x * t.out,
        running_mean=min(batch, t.d_max),
        max_num_seqs=t.d_max,
        waiting_mean=x * wait_d,
        first_token_ms=t.handoff_ms + 1000 * wait_d,
        short_steps_share=0.0 if batch > 0.9 * t.d_max else 0.9,
    )
    rng = np.random.default_rng(seed)
    jitter = rng.uniform(0.95, 1.05, t.requests)
    ttft = (res_p + net.handoff_s + wait_d) * jitter
    latency = ttft + (t.out - 1) * net.tau * jitter[::-1]
    bench = {
        "duration": t.requests / x,
        "completed": t.requests,
        "request_rate": "inf" if math.isinf(t.rate) else t.rate,
        "max_concurrency": t.clients if math.isinf(t.rate) else None,
        "output_lens": [t.out] * t.requests,
        "input_lens": [512] * t.requests,
        "ttfts": ttft.tolist(),
        "latencies": latency.tolist(),
        "errors": [""] * t.requests,
        "total_output_tokens": t.out * t.requests,
    }
    return p_status, d_status, bench


def _inputs(t: Truth, **bench_change):
    p, d, bench = pair_case(t)
    bench.update(bench_change)
    load = PairLoad(
        np.array(bench["ttfts"]),
        np.array(bench["latencies"]),
        np.array(bench["output_lens"]),
        bench["completed"] / bench["duration"],
        bench["max_concurrency"],
        math.inf if bench["request_rate"] == "inf" else bench["request_rate"],
    )
    return NodeWindow.of(StatusAnswer.from_wire(p), "P", "p"), NodeWindow.of(StatusAnswer.from_wire(d), "D", "d"), load


def _effect(r: float, low: float | None = None, high: float | None = None) -> NodeEffect:
    return NodeEffect(r, r if low is None else low, r if high is None else high, "test")


P_BOUND = Truth(prefill_ms=50.0, tpot_ms=2.0, out=33, clients=32, d_max=64)  # P near 100% busy, D's batch small
D_BOUND = Truth(prefill_ms=2.0, tpot_ms=20.0, out=257, clients=64, d_max=16)  # D full, P nearly idle
HANDOFF_BOUND = Truth(prefill_ms=2.0, tpot_ms=1.0, out=5, clients=2, handoff_ms=400.0, d_max=16)

# --- the network ------------------------------------------------------------------------------


def test_one_client_cycles_through_every_station_in_turn():
    net = Net(0.05, 1, 0.03, 0.2, 0.01, 20, 1, 4, 1.0)
    assert throughput(net, 1) == pytest.approx(1 / (0.05 + 0.03 + 0.2 + 20 * 0.01), rel=1e-12)


def test_many_clients_reach_the_bottleneck_capacity():
    p_bound = Net(0.02, 1, 0.01, 0.0, 0.001, 10, 1, 256, 1.0)
    assert throughput(p_bound, 1000) == pytest.approx(p_bound.capacity_p, rel=1e-6)
    d_bound = Net(0.001, 1, 0.01, 0.0, 0.01, 100, 1, 8, 1.0)
    assert d_bound.capacity_d == pytest.approx(8 / (100 * 0.01))
    assert throughput(d_bound, 1000) == pytest.approx(d_bound.capacity_d, rel=1e-6)


def test_the_solution_is_the_exact_ctmc_one():
    """Four clients, two P engines, a D of two sequences with a rising step: the product form's
    throughput and D's batch are the stationary CTMC's."""
    net = Net(0.05, 2, 0.03, 0.2, 0.01, 20, 1, 2, 1.5, elasticity=0.3)
    c = 4
    states = [(a, b) for a in range(c + 1) for b in range(c + 1 - a)]
    at = {s: i for i, s in enumerate(states)}
    mu_p, mu_d = net.p_rates(c), net.d_rates(c)
    q = np.zeros((len(states), len(states)))
    for (a, b), i in at.items():
        if a:
            q[i, at[(a - 1, b + 1)]] += mu_p[a - 1]
        if b:
            q[i, at[(a, b - 1)]] += mu_d[b - 1]
        if c - a - b:
            q[i, at[(a + 1, b)]] += (c - a - b) / (net.handoff_s + net.client_s)
    np.fill_diagonal(q, -q.sum(axis=1))
    pi = np.linalg.lstsq(np.vstack([q.T, np.ones(len(states))]), np.r_[np.zeros(len(states)), 1.0], rcond=None)[0]
    x = sum(pi[i] * (mu_d[b - 1] if b else 0.0) for (a, b), i in at.items())
    batch = sum(pi[i] * min(b, 2) for (a, b), i in at.items())
    sol = solve(net, c)
    assert sol.x == pytest.approx(x, rel=1e-9) and sol.d_batch == pytest.approx(batch, rel=1e-9)
    assert sol.p_utilization == pytest.approx(x * 0.05 / 2, rel=1e-12)


def test_the_clients_time_is_fitted_to_the_measured_throughput():
    net = Truth().network()
    measured = throughput(net, 8)
    fitted, fit = calibrate(dataclasses.replace(net, client_s=0.0), 8, measured)
    assert fitted.client_s == pytest.approx(net.client_s, rel=1e-6) and fit > 1
    too_fast, fit = calibrate(net, 8, 2 * measured)
    assert too_fast.client_s == 0.0 and fit < 1


def test_an_open_load_below_capacity_is_served_at_its_rate():
    net = P_BOUND.network()  # P's capacity 20/s, D's 1000/s
    assert open_throughput(net, 1.0, None) == (1.0, "offered_load")
    assert open_throughput(net, 1e6, None) == (net.capacity_p, "prefill")
    x, side = open_throughput(net, 1e6, 2)
    assert side == "clients" and x == pytest.approx(throughput(dataclasses.replace(net, client_s=0.0), 2))


def test_a_step_ratio_leaves_the_pause_between_steps():
    window = NodeWindow(FlowView.from_wire(_flow()), 1, step_ms=10.0, gap_ms=5.0)
    effect = NodeEffect.of_step_ratio(2.0, 1.5, 2.5, window, "--p-step-ratio")
    assert effect.ratio == pytest.approx(15 / 10) and effect.low == pytest.approx(15 / (10 / 1.5 + 5))
    untimed = NodeEffect.of_step_ratio(2.0, 2.0, 2.0, dataclasses.replace(window, step_ms=None), "x")
    assert untimed.ratio == 2.0 and "no timed step" in untimed.source


# --- the advice -------------------------------------------------------------------------------


def _prediction(advice: PairAdvice, layout: str):
    return next(p for p in advice.predictions if p.layout == layout)


def test_the_windows_rebuild_the_network_they_came_from():
    p, d, load = _inputs(Truth())
    net, fit = calibrate(network(p, d, load), load.clients, load.throughput)
    truth = Truth().network()
    assert net.s_p == pytest.approx(truth.s_p, rel=1e-3) and net.handoff_s == pytest.approx(truth.handoff_s, rel=1e-3)
    assert net.tau == pytest.approx(truth.tau, rel=0.02) and net.decode_tokens == truth.decode_tokens


# (load, what binds, its story, the layout that moves the pair, the one that does not)
BOUND = [(P_BOUND, "prefill", "P busy and D starved", "p", "d"), (D_BOUND, "decode", "D full and P idle", "d", "p")]


@pytest.mark.parametrize("truth, binding, story, gains, stays", BOUND, ids=["p_bound", "d_bound"])
def test_the_binding_sides_layout_carries_its_node_gain_and_the_other_does_not(truth, binding, story, gains, stays):
    """A P-bound load predicts the P node's ratio for a P layout; a D-bound one predicts ~1 for it."""
    p, d, load = _inputs(truth)
    busy, starved = (p.flow.busy_share, d.flow.batch_share) if gains == "p" else (d.flow.batch_share, p.flow.busy_share)
    assert busy > 0.95 and starved < 0.5
    advice = pair_advise(p, d, load, _effect(1.25, 1.2, 1.3), _effect(1.25, 1.2, 1.3), draws=50)
    assert advice.binding == binding and story in advice.reasons[0] and advice.verdict == "trial"
    moved, kept = _prediction(advice, gains), _prediction(advice, stays)
    assert moved.ratio == pytest.approx(1.25, rel=0.04) and moved.low <= moved.ratio <= moved.high
    assert moved.verdict == "trial" and kept.verdict == "skip"
    assert kept.ratio == pytest.approx(1.0, abs=0.01) and kept.high < 1.02
    assert _prediction(advice, "both").ratio >= moved.ratio - 1e-9


def test_a_handoff_bound_load_moves_with_neither_node():
    p, d, load = _inputs(HANDOFF_BOUND)
    advice = pair_advise(p, d, load, _effect(1.5), _effect(1.5), draws=MIN_DRAWS)
    assert advice.binding == "handoff" and advice.verdict == "skip"
    assert all(pred.ratio < 1.03 for pred in advice.predictions)


def test_an_open_load_below_capacity_predicts_one():
    t = dataclasses.replace(Truth(), rate=5.0)  # P's capacity 50/s, D's 25/s
    p, d, load = _inputs(t)
    advice = pair_advise(p, d, load, _effect(1.3, 1.2, 1.4), _effect(1.3), draws=MIN_DRAWS)
    assert advice.load == "open" and advice.binding == "offered_load"
    assert all(pred.ratio == pred.low == pred.high == 1.0 for pred in advice.predictions)
    assert any("latency only" in a for a in advice.assumptions)


def test_an_open_load_at_saturation_carries_the_binding_capacity():
    t = dataclasses.replace(P_BOUND, rate=1000.0)
    p, d, load = _inputs(t)
    advice = pair_advise(p, d, load, _effect(1.25), None, draws=MIN_DRAWS)
    assert advice.binding == "prefill" and _prediction(advice, "p").ratio == pytest.approx(1.25)


def test_the_decode_elasticity_widens_the_interval_only():
    p, d, load = _inputs(P_BOUND)
    flat = pair_advise(p, d, load, _effect(1.25), None, elasticity=0.0, draws=MIN_DRAWS)
    rising = pair_advise(p, d, load, _effect(1.25), None, elasticity=1.0, draws=MIN_DRAWS)
    a, b = _prediction(flat, "p"), _prediction(rising, "p")
    assert a.ratio == b.ratio and b.high - b.low >= a.high - a.low


def test_windows_of_another_load_are_insufficient_evidence():
    p, d, load = _inputs(P_BOUND)
    other = dataclasses.replace(load, throughput=load.throughput * 2)
    advice = pair_advise(p, d, other, _effect(1.25), None)
    assert advice.verdict == "insufficient_evidence" and not advice.predictions
    assert any("take both statuses while the bench runs" in r for r in advice.reasons)


def test_the_advice_reads_back_from_its_wire_object():
    p, d, load = _inputs(P_BOUND)
    advice = pair_advise(p, d, load, _effect(1.25, 1.2, 1.3), _effect(1.1), draws=MIN_DRAWS)
    wire = json.loads(json.dumps(advice.to_wire()))
    assert PairAdvice.from_wire(wire) == dataclasses.replace(advice, details=wire["details"])
    broken = {**wire, "predictions": [{**wire["predictions"][0], "low": 9.0}]}
    with pytest.raises(SceneEplbError, match="outside its interval"):
        PairAdvice.from_wire(broken)


@pytest.mark.parametrize(
    "option, expected",
    [
        ({"draws": 0}, f"draws must be an integer in [{MIN_DRAWS}, {MAX_DRAWS}]"),
        ({"draws": MIN_DRAWS - 1}, f"draws must be an integer in [{MIN_DRAWS}, {MAX_DRAWS}]"),
        ({"draws": 200.0}, "draws must be an integer"),
        ({"elasticity": math.nan}, "elasticity must be in [0, 1]"),
        ({"elasticity": -0.1}, "elasticity must be in [0, 1]"),
        ({"seed": -1}, "seed must be an integer >= 0"),
    ],
    ids=["no_draws", "too_few_draws", "fractional_draws", "elasticity_nan", "elasticity_negative", "seed_negative"],
)
def test_the_library_refuses_an_interval_it_cannot_draw(option, expected):
    """``pair_advise`` called directly refuses what the CLI refuses: no verdict without its interval."""
    p, d, load = _inputs(P_BOUND)
    with pytest.raises(SceneEplbError) as err:
        pair_advise(p, d, load, _effect(1.25, 1.2, 1.3), None, **option)
    assert expected in str(err.value)


# --- the CLI on saved files -----------------------------------------------------------------------


def _write(tmp_path, t: Truth, p_change=None, d_change=None, bench_change=None) -> dict[str, str]:
    p, d, bench = pair_case(t)
    for doc, change in ((p, p_change), (d, d_change), (bench, bench_change)):
        for key, value in (change or {}).items():
            if key == "flow" and value is not None:
                doc["flow"].update(value)
            else:
                doc[key] = value
    paths = {}
    for name, doc in (("p", p), ("d", d), ("bench", bench)):
        paths[name] = str(tmp_path / f"{name}.json")
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    return paths


def _args(paths, *more) -> list[str]:
    return [
        "pair-advise",
        "--p-node",
        paths["p"],
        "--d-node",
        paths["d"],
        "--bench",
        paths["bench"],
        "--draws",
        str(MIN_DRAWS),
        *more,
    ]


def test_the_cli_says_trial_for_a_p_layout_on_a_p_bound_pair(tmp_path):
    paths = _write(tmp_path, P_BOUND)
    code, out, err = run(*_args(paths, "--p-step-ratio", "1.25", "--p-interval", "1.2", "1.3", "--json"))
    assert code == 0, err
    advice = PairAdvice.from_wire(json.loads(out))
    assert advice.binding == "prefill" and _prediction(advice, "p").ratio == pytest.approx(1.25, rel=0.04)


def test_the_cli_says_skip_for_a_p_layout_on_a_d_bound_pair(tmp_path):
    paths = _write(tmp_path, D_BOUND)
    code, out, err = run(*_args(paths, "--p-step-ratio", "1.25"))
    assert code == 1, err
    assert "verdict: skip" in out and "D binds: D full and P idle" in out and "assumptions:" in out


def test_the_cli_reads_a_nodes_advise_answer(tmp_path):
    paths = _write(tmp_path, P_BOUND)
    advice = {"verdict": "trial", "predicted_throughput_ratio": 1.2, "reasons": [], "details": {"halves": [1.15, 1.25]}}
    (tmp_path / "advice.json").write_text(json.dumps({**advice, "dispatch": "static", "memory": None}))
    code, out, err = run(*_args(paths, "--p-advice", tmp_path / "advice.json", "--json"))
    assert code == 0, err
    pred = _prediction(PairAdvice.from_wire(json.loads(out)), "p")
    assert pred.node_ratio_p == 1.2 and pred.low < pred.ratio < pred.high


def test_the_cli_exits_1_on_insufficient_evidence(tmp_path):
    paths = _write(tmp_path, P_BOUND, p_change={"flow": {"prefill_completions_per_s": 1000.0}})
    code, out, err = run(*_args(paths, "--p-step-ratio", "1.25"))
    assert code == 1 and "verdict: insufficient_evidence" in out, (out, err)


GOOD_ADVICE = {"verdict": "trial", "predicted_throughput_ratio": 1.2, "reasons": [], "details": {}}
# (id, what changes (p / d status, bench, advice file, extra args), what the one error line says)
HOSTILE = [
    ("p_without_flow", {"p": {"flow": None}}, "P node's status has no flow"),
    ("d_without_flow", {"d": {"flow": None}}, "D node's status has no flow"),
    ("p_without_busy_share", {"p": {"flow": {"busy_share": None}}}, "time_moe"),
    ("p_busy_share_nan", {"p": {"flow": {"busy_share": float("nan")}}}, "busy_share must be"),
    ("p_busy_share_above_one", {"p": {"flow": {"busy_share": 1.5}}}, "busy_share"),
    ("p_prefilled_nothing", {"p": {"flow": {"prefill_completions_per_s": 0.0}}}, "prefilled nothing"),
    ("d_decoded_nothing", {"d": {"flow": {"running_mean": 0.0}}}, "decoded nothing"),
    ("d_no_steps", {"d": {"flow": {"steps": 0}}}, "no engine step"),
    ("d_runs_more_than_max", {"d": {"flow": {"running_mean": 99.0}}}, "max_num_seqs"),
    ("p_is_a_decode_node", {"p": {"role": "decode"}}, "role=decode"),
    ("status_not_an_object", {"p": "whole"}, "must be a JSON object"),
    ("scene_eplb_result", {"bench": {"format": "scene-eplb-bench"}}, "per-request times"),
    ("no_ttfts", {"bench": {"ttfts": "absent"}}, "has no 'ttfts' (vllm bench serve writes it with --save-detailed)"),
    ("ttft_nan", {"bench": {"ttfts": "nan0"}}, "ttfts[0] is nan"),
    ("ttft_negative", {"bench": {"ttfts": "neg0"}}, "ttfts[0]"),
    ("ttft_after_the_reply", {"bench": {"ttfts": "late0"}}, "first token at"),
    ("lists_of_two_lengths", {"bench": {"latencies": "short"}}, "holds 399 requests"),
    ("completed_wrong", {"bench": {"completed": 7}}, "says completed 7"),
    ("completed_string", {"bench": {"completed": "400"}}, "completed must be"),
    ("duration_zero", {"bench": {"duration": 0}}, "no duration"),
    ("rate_word", {"bench": {"request_rate": "fast"}}, "request_rate must be"),
    ("concurrency_zero", {"bench": {"max_concurrency": 0}}, "max_concurrency must be"),
    ("total_tokens_wrong", {"bench": {"total_output_tokens": 5}}, "total_output_tokens 5"),
    ("no_decode", {"bench": {"output_lens": "ones", "total_output_tokens": "absent"}}, "fewer than 2 requests with a decode"),
    ("bench_not_json", {"bench": "garbled"}, "bench result"),
    ("advice_insufficient", {"advice": {**GOOD_ADVICE, "verdict": "insufficient_evidence"}}, "pins no node ratio"),
    ("advice_ratio_negative", {"advice": {**GOOD_ADVICE, "predicted_throughput_ratio": -1}}, "predicted_throughput_ratio"),
    ("advice_halves_strings", {"advice": {**GOOD_ADVICE, "details": {"halves": ["1.1"]}}}, "halves"),
    ("interval_without_ratio", {"args": ["--d-interval", "1", "2"]}, "--d-interval is the interval"),
    ("interval_not_holding", {"args": ["--d-step-ratio", "3", "--d-interval", "1", "2"]}, "does not hold"),
    ("step_ratio_zero", {"args": ["--d-step-ratio", "0"]}, "--d-step-ratio"),
    ("elasticity_above_one", {"args": ["--d-step-ratio", "1.1", "--elasticity", "2"]}, "--elasticity"),
    ("no_candidate", {"no_p": True}, "no candidate to price"),
    ("p_node_url_closed", {"p_url": "http://127.0.0.1:9"}, "cannot reach"),
]


def _bench_value(bench: dict, key: str, how):
    values = list(bench[key]) if isinstance(bench.get(key), list) else bench.get(key)
    if how == "absent":
        return None
    if how == "short":
        return values[:-1]
    if how == "ones":
        return [1] * len(values)
    if isinstance(how, str) and how[:-1] in ("nan", "neg", "late"):
        values[0] = {"nan": float("nan"), "neg": -1.0, "late": 1e9}[how[:-1]]
        return values
    return how


@pytest.mark.parametrize("name, change, expected", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_is_one_line(tmp_path, name, change, expected):
    p, d, bench = pair_case(P_BOUND)
    docs = {"p": p, "d": d, "bench": bench}
    for side in ("p", "d"):
        new = change.get(side)
        if isinstance(new, str):
            docs[side] = new
        for key, value in (new or {}).items() if isinstance(new, dict) else ():
            if key == "flow" and value is not None:
                docs[side]["flow"].update(value)
            else:
                docs[side][key] = value
    if change.get("bench") == "garbled":
        docs["bench"] = None
    else:
        for key, how in (change.get("bench") or {}).items():
            value = _bench_value(bench, key, how)
            bench.pop(key) if value is None else bench.__setitem__(key, value)
    paths = {}
    for name_, doc in docs.items():
        path = tmp_path / f"{name_}.json"
        path.write_text('{"duration": 1, "ttfts": [' if doc is None else json.dumps(doc))
        paths[name_] = str(path)
    if "p_url" in change:
        paths["p"] = change["p_url"]
    extra = ["--p-step-ratio", "1.2"] if "advice" not in change and not change.get("no_p") else []
    if "advice" in change:
        (tmp_path / "advice.json").write_text(json.dumps(change["advice"]))
        extra = ["--p-advice", str(tmp_path / "advice.json")]
    code, out, err = run(*_args(paths, *extra, *change.get("args", [])))
    assert_one_line_error(code, err, expected, name)


# each numeric option, the values outside its range, and the range its one error line names
RANGES = [
    ("--draws", ["0", "1", str(MIN_DRAWS - 1), str(MAX_DRAWS + 1), "40.5", "nan"], f"[{MIN_DRAWS}, {MAX_DRAWS}]"),
    ("--seed", ["-1", str(2**32), "x"], "[0, 4294967295]"),
    ("--elasticity", ["-0.1", "1.01", "nan", "inf", "x"], "[0, 1]"),
    ("--d-step-ratio", ["0", "-1", "nan", "inf", "-inf", "x"], "(0, inf)"),
    ("--d-interval", [("0", "2"), ("nan", "2"), ("1", "inf")], "(0, inf)"),
]


@pytest.mark.parametrize("option, values, span", RANGES, ids=[r[0] for r in RANGES])
def test_each_numeric_option_is_refused_outside_its_range(tmp_path, option, values, span):
    """A value outside an option's range is one line naming the option and the range, exit 2."""
    paths = _write(tmp_path, P_BOUND)
    ratio = [] if option == "--d-step-ratio" else ["--d-step-ratio", "1.1"]
    for value in values:
        given = [f"{option}={value}"] if isinstance(value, str) else [option, *value]  # =: "-inf" is no option
        code, _, err = run(*_args(paths, "--p-step-ratio", "1.25", *ratio, *given))
        assert_one_line_error(code, err, f"argument {option}: ", f"{option} {value}")
        assert span in err, (option, value, err)


def test_the_ends_of_each_range_are_taken(tmp_path):
    """The fewest draws, the largest seed, a proportional decode step: a verdict with its interval."""
    paths = _write(tmp_path, P_BOUND)
    more = ["--p-step-ratio", "1.25", "--p-interval", "1.2", "1.3", "--elasticity", "1", "--seed", str(2**32 - 1)]
    code, out, err = run(*_args(paths, *more, "--json"))
    assert code == 0, err
    advice = PairAdvice.from_wire(json.loads(out))
    assert advice.details["draws"] == MIN_DRAWS and _prediction(advice, "p").low < _prediction(advice, "p").high


def test_a_closed_loops_throughput_leaves_out_its_ramp(tmp_path):
    """4 clients, each request 5 s, started 0.1 s apart and resent at once until 20 s: 0.8 requests/s.
    Counted over the span all four were busy, the first 5 s (nothing finished yet) read it as ~0.6."""
    starts, lat = [], []
    for k in range(4):
        t = 0.1 * k
        while t < 20.0:
            starts.append(t)
            lat.append(5.0)
            t += 5.0
    n = len(starts)
    bench = {"duration": max(s + x for s, x in zip(starts, lat)), "completed": n, "request_rate": "inf", "max_concurrency": 4}
    bench |= {"output_lens": [8] * n, "ttfts": [1.0] * n, "latencies": lat, "start_times": starts}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    load = read_vllm_result(path)
    assert load.throughput == pytest.approx(0.8, rel=0.03)
    assert closed_loop_rate(np.array(starts[:4]), np.array(lat[:4]), 4) is None  # no completion after the ramp
