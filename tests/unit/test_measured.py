"""Measured replica traffic and rank time (counts -> time): the observer's physical counts and timing,
the runtime's replica maps measured against the dispatch model (fidelity), the live window's
measured and time views, and physical counts through every counts format."""

import time

import numpy as np
import pytest
import torch

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import read_counts, write_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.live.fitness import LiveFitness, LiveSample
from vllm_scene_eplb.live.measured import (
    RankTime,
    SourceTraffic,
    fidelity,
    measured_scores,
    modelled_slot_counts,
    per_pass_critical,
    time_view,
)
from vllm_scene_eplb.protocol import PassTimes
from vllm_scene_eplb.runtime.worker.moe_timing import PASS_LOG, MoeTiming
from vllm_scene_eplb.runtime.worker.observer import RoutingObserver
from vllm_scene_eplb.runtime.worker.replica_map import SourceRanks, layer_maps

from ..conftest import skewed_counts

pytestmark = pytest.mark.timed  # asserts on time or waits on a tight deadline: the first lane (tests/conftest.py)

E, L, EP, R, TOP_K = 16, 3, 4, 4, 2


HOT = 1.0 / (1 + np.arange(E)) ** 1.2  # the scene: expert popularity, the same in every layer
HOT /= HOT.sum()


@pytest.fixture(scope="module")
def layout():
    """A static layout fitted to the scene the tests then route."""
    counts = np.random.default_rng(5).multinomial(50000 * TOP_K, HOT, size=(2, L))
    return fit(Counts(counts), FitOptions(Geometry(E, R, EP), dispatch="static"))


def _route(layout, dispatch: str, sources: list[SourceRanks], tokens: int, seed: int):
    """Each source group's batch of skewed top-k ids through the runtime's replica maps into an
    observer, as the vLLM adapter wires them: (logical per source, physical summed) per layer."""
    rng = np.random.default_rng(seed)
    per_source, physical = [], np.zeros((L, layout.geometry.num_physical), dtype=np.int64)
    for src in sources:
        maps = layer_maps(layout, dispatch, "cpu", src)
        obs = RoutingObserver(L, E, 4, slot_to_expert=torch.as_tensor(layout.physical_to_logical_map))
        for layer in range(L):
            ids = torch.from_numpy(np.stack([rng.choice(E, TOP_K, replace=False, p=HOT) for _ in range(tokens)]))
            obs.capture(layer, maps[layer](ids))  # the router's slots; logical counts follow from them
        obs.end_step()
        live = obs.live_counts()
        per_source.append(SourceTraffic(src.base, src.span, live.logical.numpy()))
        physical += live.physical.numpy()
    return per_source, physical


@pytest.mark.parametrize("dispatch", ["static", "dynamic"])
def test_the_runtime_dispatch_does_what_the_model_says_and_a_wrong_one_shows(layout, dispatch):
    p2l, g = layout.physical_to_logical_map, layout.geometry
    # DP x EP: every rank routes its own batch (span 1); the static model is then exact
    dp = [SourceRanks(r, 1) for r in range(EP)]
    sources, physical = _route(layout, dispatch, dp, tokens=3000, seed=1)
    assert physical.sum(axis=1).tolist() == [EP * 3000 * TOP_K] * L  # every assignment reached one slot
    modelled = modelled_slot_counts(p2l, g, dispatch, sources, layout.static_sources)
    got = fidelity(physical, modelled, p2l, E)
    # static is deterministic: exact; dynamic splits rows, not tokens, evenly: sampling noise only
    assert got < (1e-9 if dispatch == "static" else 0.1), got
    # a dispatch that ignores the replicas (every expert's traffic on its first slot) is far off
    first = np.zeros_like(physical)
    for layer in range(L):
        for e in range(E):
            first[layer, np.flatnonzero(p2l[layer] == e)[0]] = physical[layer, p2l[layer] == e].sum()
    assert fidelity(first, modelled, p2l, E) > 0.3
    # measured rank balance follows the slot counts: the fitted layout is near 1, the model agrees
    measured = measured_scores(physical, g)
    assert measured.max() < 1.1 and np.allclose(measured, measured_scores(modelled, g), atol=0.02)


def test_a_tp_batch_seen_by_all_ranks_is_split_over_their_rows(layout):
    """TP>1, DP=1: one batch, every rank sees it, rows split evenly over the span: the model splits
    the batch's counts evenly too, which is right up to sampling noise."""
    sources, physical = _route(layout, "static", [SourceRanks(0, EP)], tokens=20000, seed=2)
    modelled = modelled_slot_counts(layout.physical_to_logical_map, layout.geometry, "static", sources, layout.static_sources)
    assert fidelity(physical, modelled, layout.physical_to_logical_map, E) < 0.03


def test_time_view_names_the_slow_rank_and_the_moe_share():
    ranks = [RankTime(np.array([0.2, 0.1]), 10, 10, 2.0, 0.3), RankTime(np.array([0.6, 0.1]), 10, 10, 2.0, 0.7)]
    view = time_view(ranks, np.array([[100.0, 300.0], [50.0, 50.0]]))
    assert view is not None
    t = view.to_wire()
    assert t["rank_ms"] == [[20.0, 10.0], [60.0, 10.0]]
    assert t["per_layer"] == [1.5, 1.0] and t["worst"] == 1.5 and t["median"] == 1.25
    assert t["moe_share"] == pytest.approx(0.25) and t["step_ms"] == pytest.approx(200.0)
    assert t["rank_assignments"] == [[10.0, 5.0], [30.0, 5.0]]  # per pass: the x of the count -> time model
    assert time_view([ranks[0], RankTime(np.zeros(2), 0, 0, 0.0, 0.0)]) is None  # a rank without timing: no view


def test_observer_times_moe_per_layer_and_steps():
    obs = RoutingObserver(2, 4, 2, time_moe=True)
    obs.begin_step()
    obs.add_moe_seconds(0, 0.01)
    obs.add_moe_seconds(1, 0.03)
    time.sleep(0.05)  # the real step's wall time: what step_seconds must hold
    obs.end_step()
    obs.begin_step()
    obs.add_moe_seconds(0, 0.02)  # a dummy pass: its experts still ran (a DP peer's tokens)
    time.sleep(0.2)  # a dummy step's wall time is not a real step's: it must not count
    obs.end_step(is_dummy=True)
    live = obs.live_counts()
    assert live.moe_seconds == pytest.approx([0.03, 0.03]) and live.moe_passes == 2
    assert live.step_moe_seconds == pytest.approx(0.04) and live.steps == 1
    assert 0.05 <= live.step_seconds < 0.2, live.step_seconds  # seconds, the real step only
    assert RoutingObserver(2, 4, 2).live_counts().moe_seconds is None  # time_moe off: nothing timed


def test_the_pause_between_busy_steps_is_timed_and_an_idle_one_is_not(monkeypatch):
    """The pause from a step's end to the next one's start is what a busy step's throughput pays beside
    the step; a pause of IDLE_PAUSE_S or more is the engine waiting for work, and is left out."""
    from vllm_scene_eplb.runtime.worker import moe_timing

    clock = iter([0.0, 0.05, 0.07, 0.12, 0.12 + moe_timing.IDLE_PAUSE_S + 0.1, 0.8, 0.83, 0.9])
    monkeypatch.setattr(moe_timing.time, "perf_counter", lambda: next(clock))
    obs = RoutingObserver(2, 4, 2, time_moe=True)
    for dummy in (False, False, True, False):  # pauses: 20 ms (counted), 0.6 s (idle), 30 ms after a dummy step
        obs.begin_step()
        obs.add_moe_seconds(0, 0.001)
        obs.end_step(is_dummy=dummy)
    live = obs.live_counts()
    assert live.gaps == 2 and live.gap_seconds == pytest.approx(0.05), (live.gaps, live.gap_seconds)
    assert live.steps == 3 and live.step_seconds == pytest.approx(0.05 + 0.05 + 0.07)


def test_live_window_reports_measured_fidelity_and_time(layout):
    sources, physical = _route(layout, "static", [SourceRanks(r, 1) for r in range(EP)], tokens=2000, seed=3)
    logical = sum(s.counts for s in sources)
    live = LiveFitness.for_server(layout, E, EP, "static", tuple(range(L)), margin=0.05, windows=3)
    times = tuple(RankTime(np.full(L, 0.01 * (r + 1)), 5, 5, 1.0, 0.1) for r in range(EP))
    live.observe(LiveSample(logical, 5, physical, tuple(sources), times), now=0.0)
    d = live.to_wire()
    assert d["fidelity"] < 1e-9 and abs(d["measured"]["median"] / d["median"] - 1) < 0.02
    assert d["time"]["worst"] == pytest.approx(1.6) and d["time"]["moe_share"] == pytest.approx(0.1)
    # the next window works on differences: twice the same traffic reads the same
    live.observe(
        LiveSample(
            2 * logical,
            10,
            2 * physical,
            tuple(SourceTraffic(s.base, s.span, 2 * s.counts) for s in sources),
            tuple(RankTime(2 * t.moe_seconds, 10, 10, 2.0, 0.2) for t in times),
        ),
        now=1.0,
    )
    assert live.to_wire()["fidelity"] < 1e-9 and live.to_wire()["time"]["worst"] == pytest.approx(1.6)


@pytest.mark.parametrize("fmt, suffix", [("scene-eplb", "npz"), ("sglang", "json"), ("pt", "pt")])
def test_physical_counts_survive_every_counts_format(tmp_path, fmt, suffix):
    logical = skewed_counts(3, 2, 4, seed=1, top_k=1, tokens=16)
    physical = np.concatenate([logical, np.zeros_like(logical[..., :2])], axis=2)  # 4 experts on 6 slots
    physical[..., [4, 5]], physical[..., [0, 1]] = logical[..., [0, 1]] // 2, logical[..., [0, 1]] - logical[..., [0, 1]] // 2
    path = write_counts(Counts(logical, {}, physical), tmp_path / f"c.{suffix}", fmt)
    back = read_counts(path)
    assert np.array_equal(back.data, logical) and np.array_equal(back.physical, physical)


@pytest.mark.parametrize(
    "cut, message",
    [(slice(None), r"physical_count holds .* at \[T, L\] = \[1, 0\]"), (slice(1), "does not match logical_count")],
    ids=["one-assignment-too-many", "fewer-passes"],
)
def test_physical_counts_that_do_not_add_up_are_refused(cut, message):
    logical = skewed_counts(2, 2, 4, seed=1, top_k=1, tokens=16)
    physical = logical.copy()
    physical[1, 0, 0] += 1
    with pytest.raises(SceneEplbError, match=message):
        Counts(logical, {}, physical[cut])


def test_the_live_sample_takes_every_ranks_own_rows_as_its_static_source():
    """TP=2: rank 0 counts the batch, each rank its own rows; the sample's sources are the own rows
    of every rank (span 1, row = EP rank), contributing or not, never an even split of the counts."""
    from vllm_scene_eplb.protocol import RankLiveAnswer
    from vllm_scene_eplb.runtime.server.live_poller import live_sample

    batch, own0 = np.array([[5, 3, 0, 2]]), np.array([[4, 0, 0, 1]])

    def answer(rank: int, own) -> RankLiveAnswer:
        return RankLiveAnswer.from_wire(
            {
                "counts": batch.tolist(),
                "physical": None,
                "own_counts": own.tolist(),
                "passes": 2,
                "moe_seconds": None,
                "moe_passes": 0,
                "steps": 0,
                "step_seconds": 0.0,
                "step_moe_seconds": 0.0,
                "gap_seconds": 0.0,
                "gaps": 0,
                "contributes": rank == 0,
                "ep_rank": rank,
                "source": [0, 2],
                "moe_layers": [3],
            }
        )

    sample = live_sample([answer(1, batch - own0), answer(0, own0)])
    assert sample.logical.tolist() == batch.tolist() and sample.passes == 2
    assert [(s.base, s.span, s.counts.tolist()) for s in sample.sources] == [
        (0, 1, own0.tolist()),
        (1, 1, (batch - own0).tolist()),
    ]


def test_the_per_pass_critical_path_lines_the_ranks_passes_up_by_number():
    # rank 0 logged passes 4-7, rank 1 passes 5-8: passes 5-7 are common; one layer, the slow rank alternates
    rank0 = PassTimes(4, ((9.0,), (3.0,), (1.0,), (3.0,)))
    rank1 = PassTimes(5, ((1.0,), (3.0,), (1.0,), (9.0,)))
    got = per_pass_critical([rank0, rank1])
    assert got is not None and got.passes == 3
    assert got.ms == pytest.approx(3.0) and got.of_means == pytest.approx(7 / 3)  # per pass 3, 3, 3; means 7/3 and 5/3
    assert per_pass_critical([rank0, None]) is None
    assert per_pass_critical([rank0, PassTimes(8, ((1.0,),))]) is None  # no pass in common


def test_the_moe_timer_logs_its_last_passes_numbered_as_it_counts_them():
    timing = MoeTiming(2, on=True, cpu=True)
    for i in range(PASS_LOG + 8):
        timing.begin_step()
        timing.add_moe_seconds(0, (i + 1) / 1000)
        timing.add_moe_seconds(1, 0.0005)
        timing.end_step(is_dummy=i == PASS_LOG + 6)  # a dummy pass holds its peers' barrier: logged too
    got = timing.passes_since(PASS_LOG + 5)
    assert got is not None and got.first == PASS_LOG + 5
    assert np.allclose(got.ms, [[PASS_LOG + 6.0, 0.5], [PASS_LOG + 7.0, 0.5], [PASS_LOG + 8.0, 0.5]])
    assert timing.passes_since(0).first == 8 and len(timing.passes_since(0).ms) == PASS_LOG  # the last PASS_LOG
    assert timing.passes_since(PASS_LOG + 8) is None  # none since
    assert MoeTiming(2, on=False, cpu=True).passes_since(0) is None
