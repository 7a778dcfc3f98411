"""Several scenes in one fit: normalisation, weights, objectives, and the gain out of scene on real counts."""

import numpy as np
import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fit import FitOptions, fit, fit_map, fit_scenes
from vllm_scene_eplb.formats import read_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.layouts.scenes import normalise_weights, normalised_totals
from vllm_scene_eplb.layouts.score import dispatch_score

from ..conftest import skewed_counts


def test_weights_default_equal_and_are_normalised():
    assert normalise_weights(None, 4).tolist() == [0.25] * 4
    assert normalise_weights([3, 1], 2).tolist() == [0.75, 0.25]


@pytest.mark.parametrize(
    "bad, msg",
    [([1.0], "1 scene weight"), ([1, 0], "positive"), ([1, float("nan")], "positive")],
    ids=["one-weight-for-two-scenes", "zero", "nan"],
)
def test_bad_weights_are_refused(bad, msg):
    with pytest.raises(SceneEplbError, match=msg):
        normalise_weights(bad, 2)


def test_a_long_recording_does_not_drown_a_short_one():
    """Scenes are normalised per layer: the same scene recorded 100x longer gives the same layout."""
    a, b = Counts(skewed_counts(1, 3, 32, seed=1)), Counts(skewed_counts(1, 3, 32, seed=2))
    long_b = Counts(b.data * 100)
    opts = FitOptions(Geometry(32, 8, 8), dispatch="static")
    one, other = fit([a, b], opts), fit([a, long_b], opts)
    assert (one.physical_to_logical_map == other.physical_to_logical_map).all()
    assert (one.static_sources == other.static_sources).all()
    alone = fit(a, opts)
    assert (one.physical_to_logical_map != alone.physical_to_logical_map).any()  # b counted


def test_layout_records_its_scenes_and_weights_change_the_fingerprint():
    a, b = Counts(skewed_counts(1, 2, 16, seed=3)), Counts(skewed_counts(1, 2, 16, seed=4))
    opts = FitOptions(Geometry(16, 4, 4), dispatch="dynamic")
    even, skewed = fit([a, b], opts), fit([a, b], opts, [0.9, 0.1])
    assert even.meta["source_counts_sha256"] == [a.digest(), b.digest()]
    assert even.meta["scene_weights"] == [0.5, 0.5] and skewed.meta["scene_weights"] == [0.9, 0.1]
    assert even.meta["objective"] == "mean" and even.meta["fingerprint"] != skewed.meta["fingerprint"]


@pytest.mark.parametrize(
    "other, message",
    [
        (lambda: Counts(skewed_counts(1, 2, 16), {"model": "m2"}), "different models"),
        (lambda: Counts(skewed_counts(1, 3, 16)), "scenes must come from one model"),
    ],
    ids=["another-model-name", "another-layer-count"],
)
def test_scenes_that_cannot_share_a_layout_are_refused(other, message):
    a = Counts(skewed_counts(1, 2, 16), {"model": "m1"})
    with pytest.raises(SceneEplbError, match=message):
        fit([a, other()], FitOptions(Geometry(16, 4, 4)))


def test_an_unknown_objective_is_refused():
    with pytest.raises(SceneEplbError, match="objective must be one of"):
        FitOptions(Geometry(16, 4, 4), objective="best")


@pytest.fixture(scope="module")
def real_scenes(real_counts_paths):
    out = {}
    for p in real_counts_paths:
        c = read_counts(p)
        out[p.stem] = normalised_totals([c.data[:, c.active_layers()]])[0]
    return out


@pytest.mark.parametrize("dispatch", ["dynamic", "static"])
def test_one_layout_for_two_scenes_holds_up_better_out_of_scene(real_scenes, dispatch):
    """Leave one real scene out: the layout fitted on the other two scores better on it, median and
    worst layer pooled over the three folds, than a layout fitted on either scene alone."""
    g = Geometry(256, 16, 16)
    opts = FitOptions(g, dispatch=dispatch, expert_groups=8)
    multi, single = [], []
    for held, unseen in real_scenes.items():
        train = [w for name, w in real_scenes.items() if name != held]
        fitted = fit_scenes([w[None] for w in train], np.array([0.5, 0.5]), opts)
        multi.append(dispatch_score(fitted.map, unseen, g, dispatch, fitted.static_sources))
        for w in train:
            alone = fit_map(w[None], opts)
            single.append(dispatch_score(alone.map, unseen, g, dispatch, alone.static_sources))
    multi, single = np.concatenate(multi), np.concatenate(single)
    assert np.median(multi) < np.median(single) and multi.max() < single.max(), (
        np.median(multi),
        np.median(single),
        multi.max(),
        single.max(),
    )


@pytest.mark.parametrize("dispatch", ["dynamic", "static"])
def test_worst_objective_lowers_the_worst_scene_in_sample(real_scenes, dispatch):
    g = Geometry(256, 16, 16)
    train = [real_scenes["prefill_in4096"], real_scenes["prefill_in1024"]]

    def worst_scene(objective):
        f = fit_scenes(
            [w[None] for w in train], np.array([0.5, 0.5]), FitOptions(g, dispatch=dispatch, expert_groups=8, objective=objective)
        )
        return np.max([dispatch_score(f.map, w, g, dispatch, f.static_sources) for w in train], axis=0)

    mean, worst = worst_scene("mean"), worst_scene("worst")
    assert (worst <= mean + 1e-12).all()  # per layer: it keeps the mean fit wherever the refit is no better
    assert worst.max() < mean.max() - 0.01
