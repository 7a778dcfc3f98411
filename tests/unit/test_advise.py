"""The count -> time model and the go/no-go advisor against a truth it does not share: a simulated
server (``rig.simulated``) whose passes are sampled from each layer's distribution, whose ranks
take a + b x assignments, and whose true ratio is computed on fresh passes. Advise predicts it
from a dump at one step per entry and at 16, says skip on an even scene and on a gain that does not
hold, and says insufficient_evidence, naming the mismatch, where its evidence does not hold."""

import json
from dataclasses import replace

import numpy as np
import pytest

from vllm_scene_eplb.advise import MIN_PASSES, Setup, advise, fit_time_model, passes_per_entry, split_passes
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry, Layout
from vllm_scene_eplb.protocol import PROVENANCE_KEYS, TimingWindow

from ..advise_scene import EVEN, SKEWED, L, candidate, scene, server, write_case
from .test_bad_input import run

PASSES = 256


def _recording(p=SKEWED, tokens=64, seed=0, passes=PASSES):
    s = scene(p, tokens)
    return s, s.passes(passes, np.random.default_rng(seed))


def _advise(counts: Counts, s, rec, k, **kw):
    return advise(counts, candidate(counts), "static", server(s).timing_window(rec, k), **kw)


@pytest.mark.parametrize("tokens", [16, 256], ids=["decode-like", "prefill-like"])
def test_the_ratio_is_the_per_pass_truth_at_one_step_per_entry_and_at_16(tokens):
    s, rec = _recording(tokens=tokens)
    ratios = {}
    for k in (1, 16):
        counts = server(s).dump(rec, k)
        answer = _advise(counts, s, rec, k)
        assert answer.verdict == "trial", answer.reasons
        ratios[k] = answer.predicted_throughput_ratio
    truth = server(s).true_ratio(candidate(server(s).dump(rec, 1)), "static", 4096, np.random.default_rng(99))
    assert abs(ratios[1] - ratios[16]) < 0.005, ratios
    assert abs(ratios[1] - truth) < 0.02 and abs(ratios[16] - truth) < 0.02, (ratios, truth)


def test_the_pause_between_steps_is_paid_by_each_step_and_no_layout_changes_it():
    """The same saving of MoE time over a longer cycle (step plus the pause before the next): the
    ratio is cycle / (cycle - saving), so a quarter of the step spent between steps lowers it."""
    s, rec = _recording()
    counts = server(s).dump(rec, 1)
    window = server(s).timing_window(rec, 1)
    plain = advise(counts, candidate(counts), "static", window)
    paused = advise(counts, candidate(counts), "static", replace(window, gap_ms=window.step_ms / 4))
    d = paused.details
    saving = d["critical_ms_now"] - d["critical_ms_candidate"]
    cycle = d["step_ms"] + d["gap_ms"]
    assert saving > 0 and d["gap_ms"] == window.step_ms / 4 and d["critical_ms_now"] == plain.details["critical_ms_now"]
    assert paused.predicted_throughput_ratio == pytest.approx(cycle / (cycle - saving))
    assert 1 < paused.predicted_throughput_ratio < plain.predicted_throughput_ratio
    assert f"{d['gap_ms']:.2f} ms between steps" in " ".join(paused.reasons)


def test_a_k_pass_entry_is_split_into_k_passes_of_equal_size_that_sum_back():
    entries = np.random.default_rng(3).multinomial(16 * 100, np.full(8, 1 / 8), size=(5, 2))
    parts = split_passes(entries, 16, np.random.default_rng(0))
    assert parts.shape == (5, 16, 2, 8) and (parts.sum(axis=1) == entries).all()
    assert (parts.sum(axis=3) == 100).all()
    # thinning keeps the per-pass spread of a multinomial pass, which a split into means would not
    assert parts[..., 0].std() > 0.5 * np.sqrt(100 * (1 / 8) * (7 / 8))


def test_an_even_scene_says_skip():
    s, rec = _recording(EVEN, seed=1)
    answer = _advise(server(s).dump(rec, 16), s, rec, 16)
    assert answer.verdict == "skip" and answer.predicted_throughput_ratio < 1.02, answer.reasons


def test_a_gain_that_does_not_hold_on_both_halves_says_skip():
    s, first = _recording(SKEWED, seed=2, passes=PASSES // 2)
    _, second = _recording(EVEN, seed=3, passes=PASSES // 2)
    rec = np.concatenate([first, second])
    counts = server(s).dump(rec, 1)
    fitted = candidate(server(s).dump(first, 1))  # fitted on the first half's scene only
    window = replace(server(s).timing_window(rec, 1), sub_windows=())  # (their spread would see the change too)
    answer = advise(counts, fitted, "static", window)
    assert answer.verdict == "skip" and answer.predicted_throughput_ratio > 1.02, answer.reasons
    assert min(answer.details["halves"]) < 1.02 < max(answer.details["halves"])
    assert "does not hold on both halves" in answer.reasons[-1]


def test_a_critical_path_longer_than_the_step_says_so():
    s, rec = _recording()
    big = scene(SKEWED, tokens=640)
    heavy = big.passes(PASSES, np.random.default_rng(5))  # the dump's passes are ten times the timed ones
    answer = _advise(server(big).dump(heavy, 1), s, rec, 1)
    assert answer.verdict == "insufficient_evidence"
    assert "longer than the whole step" in answer.reasons[-1], answer.reasons
    assert "its record_time is the record's own window" in answer.reasons[-1]  # a live window: the way out named
    assert "a live window, which may hold other passes" in answer.reasons[-2]


@pytest.mark.parametrize(
    "key, value", [("layout_hash", "0123456789abcdef"), ("role", "prefill"), ("steps_per_entry", 16), ("ep_size", 4)]
)
def test_a_timing_window_from_another_setup_names_the_mismatch(key, value):
    s, rec = _recording()
    counts = server(s).dump(rec, 1)
    window = server(s).timing_window(rec, 1)
    window = replace(window, provenance={**window.provenance, key: value})
    answer = advise(counts, candidate(counts), "static", window)
    assert answer.verdict == "insufficient_evidence"
    assert key in answer.reasons[-1] and repr(value) in answer.reasons[-1], answer.reasons


@pytest.mark.parametrize("key", PROVENANCE_KEYS)
def test_a_timing_window_that_leaves_a_provenance_key_out_is_refused_not_read_as_null(key):
    """Absent is not null: a window without ``layout_hash`` once read as the linear layout's and gave
    ``trial`` on a dump of the linear server; ``layout_hash`` null is the linear layout, a value."""
    s, rec = _recording()
    wire = server(s).timing_window(rec, 1).to_wire()
    assert wire["provenance"]["layout_hash"] is None and TimingWindow.from_wire(wire).provenance == wire["provenance"]
    del wire["provenance"][key]
    with pytest.raises(SceneEplbError, match=f"does not say its {key} "):
        TimingWindow.from_wire(wire)


def test_a_timing_window_of_the_linear_layout_does_not_price_a_dump_of_another():
    s, rec = _recording()
    counts = server(s).dump(rec, 1)
    counts = Counts(counts.data, {**counts.meta, "layout_hash": "0123456789abcdef"}, physical=counts.physical)
    answer = advise(counts, candidate(counts), "static", server(s).timing_window(rec, 1), running=candidate(counts))
    assert (
        answer.verdict == "insufficient_evidence" and "layout_hash is '0123456789abcdef' in the dump, None" in answer.reasons[-1]
    )


def test_a_model_that_disagrees_with_the_measured_traffic_says_so():
    s, rec = _recording()
    counts = server(s).dump(rec, 1)
    total = counts.physical.sum(axis=2, keepdims=True)  # measured: every slot an even share, as no dispatch of this layout gives
    even = total // 16 + (np.arange(16) < total % 16)
    wrong = Counts(counts.data, counts.meta, physical=even)
    answer = _advise(wrong, s, rec, 1)
    assert answer.verdict == "insufficient_evidence", answer.reasons
    assert "measured replica traffic" in answer.reasons[-1] and "does not describe this server" in answer.reasons[-1]


def test_a_timing_window_of_another_traffic_says_so():
    s, rec = _recording()
    _, even = _recording(EVEN, seed=4)
    answer = _advise(server(s).dump(rec, 1), s, even, 1)  # timed on even traffic, the dump is skewed
    assert answer.verdict == "insufficient_evidence"
    assert "timing window's mean pass" in answer.reasons[-1], answer.reasons


def test_a_timing_window_of_the_same_traffic_in_larger_passes_is_not_a_disagreement():
    """The live window may hold passes of another size than the dump's (the demo's window is the
    poller's last one): the model is checked at the window's own load, so the same routing timed in
    passes four times as large still gives a verdict, not insufficient_evidence."""
    s, rec = _recording(tokens=64)
    big, rec_big = _recording(tokens=256, seed=5)
    answer = advise(server(s).dump(rec, 1), candidate(server(s).dump(rec, 1)), "static", server(big).timing_window(rec_big, 1))
    assert answer.verdict in ("trial", "skip"), answer.reasons


def test_too_few_passes_say_so():
    s, rec = _recording(passes=MIN_PASSES - 1)
    answer = _advise(server(s).dump(rec, 1), s, rec, 1)
    assert answer.verdict == "insufficient_evidence" and f"{MIN_PASSES - 1} passes" in answer.reasons[-1]


def test_missing_evidence_says_so():
    s, rec = _recording()
    counts = server(s).dump(rec, 1)
    layout = candidate(counts)
    assert advise(counts, layout, "static", None).verdict == "insufficient_evidence"
    assert "time_moe" in advise(counts, layout, "static", {}).reasons[-1]
    no_physical = Counts(counts.data, counts.meta)
    assert "physical_count" in advise(no_physical, layout, "static", server(s).timing_window(rec, 1)).reasons[-1]


def test_the_noise_floor_is_measured_and_never_under_two_percent():
    s, rec = _recording()
    counts = server(s).dump(rec, 1)
    window = server(s).timing_window(rec, 1)
    base = advise(counts, candidate(counts), "static", window).details
    assert base["noise_floor"] == pytest.approx(0.02)
    noisy = replace(window, sub_windows=tuple(window.step_ms * f for f in (0.8, 1.2, 0.9, 1.1)))
    answer = advise(counts, candidate(counts), "static", noisy)
    assert answer.details["noise_floor"] > 0.2 and answer.verdict == "skip", answer.details
    ab = advise(counts, candidate(counts), "static", window, ab_ratio=1.149)
    assert ab.details["noise_floor"] == pytest.approx(0.149) and "identical setups" in ab.details["noise_floor_source"]


def test_a_slope_that_is_not_positive_takes_the_pooled_fit():
    # layer 1's ranks: more assignments, less time (a negative slope); layer 0 slopes up
    model = fit_time_model(np.array([[1.0, 2.0], [2.0, 1.0]]), np.array([[100.0, 100.0], [200.0, 200.0]]))
    assert model.b[1] == model.pooled_b and model.b[0] == pytest.approx(0.01)


def test_a_window_whose_time_falls_with_assignments_cannot_price_a_layout():
    s, rec = _recording()
    counts = server(s).dump(rec, 1)
    window = server(s).timing_window(rec, 1)
    ms = np.asarray(window.rank_ms)
    flipped = replace(window, rank_ms=tuple(tuple(float(x) for x in row) for row in ms[::-1]))  # the busy rank is fastest
    answer = advise(counts, candidate(counts), "static", flipped)
    assert answer.verdict == "insufficient_evidence" and "does not grow with assignments" in answer.reasons[-1]
    assert fit_time_model(ms[::-1], np.asarray(window.rank_assignments)).pooled_b < 0


def test_the_cli_reads_a_saved_status_and_exits_by_verdict(tmp_path):
    paths = write_case(tmp_path)
    code, out, err = run("advise", paths["dump"], "--layout", paths["cand"], "--timing", paths["status"], "--json")
    assert code == 0 and json.loads(out)["verdict"] == "trial", err
    code, out, _ = run("advise", paths["dump"], "--layout", paths["cand"])
    assert code == 1 and "insufficient_evidence" in out
    assert L == len(json.loads(paths["status"].read_text())["live"]["time"]["rank_ms"][0])


def test_a_server_running_a_layout_is_priced_through_its_own_dispatch():
    s, rec = _recording(tokens=256)
    running = candidate(server(s).dump(rec, 1))
    srv = server(s, running, "static")
    counts, window = srv.dump(rec, 16), srv.timing_window(rec, 16)
    answer = advise(counts, running, "static", window, running=running)  # the same layout again: nothing to gain
    assert answer.verdict == "skip" and answer.predicted_throughput_ratio == pytest.approx(1.0), answer.reasons
    assert answer.details["fidelity_now"] < 0.01
    with pytest.raises(SceneEplbError, match="--running"):
        advise(counts, running, "static", window)


def test_a_partly_filled_last_entry_holds_the_passes_its_tokens_say():
    s, rec = _recording(passes=20)
    counts = server(s).dump(rec, 16)  # 16 passes, then 4
    assert passes_per_entry(counts, list(range(L))).tolist() == [16, 4]
    bare = Counts(counts.data, {k: v for k, v in counts.meta.items() if k != "scheduled_tokens"}, physical=counts.physical)
    assert passes_per_entry(bare, list(range(L))).tolist() == [16, 16]  # without tokens: steps_per_entry each


def test_a_window_that_does_not_pin_the_slope_gives_the_bound_not_a_ratio():
    s, rec = _recording(tokens=256)
    running = candidate(server(s).dump(rec, 1))
    srv = replace(server(s, running, "static"), noise=0.05)  # balanced ranks, noisy ms: the slope is not identified
    counts, window = srv.dump(rec, 1), srv.timing_window(rec, 1)
    same = advise(counts, running, "static", window, running=running)
    assert same.verdict == "skip" and same.predicted_throughput_ratio is None, same.reasons
    assert "does not pin the slope" in same.reasons[-1] and same.details["bound_ratio"] == pytest.approx(1.0)
    linear = Setup.of(None, Geometry(16, 0, 2), "dynamic", list(range(L)), None)
    back = Layout(linear.p2l, linear.geometry)  # back to the linear layout: a large loss, and even its bound is no trial
    worse = advise(counts, back, "dynamic", window, running=running)
    assert worse.verdict != "trial", worse.reasons


def _bench_result(path, throughput: float):
    from vllm_scene_eplb.ab.results import METRICS, RESULT_FORMAT
    from vllm_scene_eplb.fileio import doc_checksum

    doc = {
        "format": RESULT_FORMAT,
        "manifest": {"scene": {}},
        "runs": [],
        "aggregate": {m: {"mean": throughput, "ci95": None} for m in METRICS},
    }
    path.write_text(json.dumps({**doc, "checksum": doc_checksum(doc)}))
    return path


def test_the_cli_takes_the_noise_floor_from_an_ab_of_identical_setups(tmp_path):
    paths = write_case(tmp_path)
    a, b = _bench_result(tmp_path / "a.json", 1000.0), _bench_result(tmp_path / "b.json", 1149.0)
    code, out, err = run(
        "advise", paths["dump"], "--layout", paths["cand"], "--timing", paths["status"], "--noise-ab", a, b, "--json"
    )
    answer = json.loads(out)
    assert (
        answer["details"]["noise_floor"] == pytest.approx(0.149) and "identical setups" in answer["details"]["noise_floor_source"]
    )
    assert code == 1 and answer["verdict"] == "skip"  # +13.6% predicted: a trial without the A/B, under its 14.9%
    assert run("advise", paths["dump"], "--layout", paths["cand"], "--timing", paths["status"])[0] == 0


def test_a_record_window_measured_pass_by_pass_holds_the_per_pass_price_of_the_running_layout():
    """Where the record window carries its critical path measured pass by pass, advise holds its
    per-pass price of the running layout to it: agreeing, the verdict stands; 30% apart (the per-pass
    model does not describe this server), insufficient_evidence with both numbers."""
    s, rec = _recording(tokens=16)
    counts = server(s).dump(rec, 1)
    window = server(s).timing_window(rec, 1)
    plain = advise(counts, candidate(counts), "static", window)
    priced = plain.details["critical_ms_now"]
    agreeing = advise(counts, candidate(counts), "static", replace(window, critical_ms=priced * 1.001))
    assert agreeing.verdict == plain.verdict == "trial", agreeing.reasons
    assert agreeing.details["per_pass_critical_ms_measured"] == pytest.approx(priced * 1.001)
    apart = advise(counts, candidate(counts), "static", replace(window, critical_ms=priced * 1.3))
    assert apart.verdict == "insufficient_evidence"
    assert any("the critical path measured pass by pass" in r and f"{priced:.3f}" in r for r in apart.reasons), apart.reasons
    assert plain.details["per_pass_critical_ms_measured"] is None  # a window without it is not held to it
