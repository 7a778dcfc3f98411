import numpy as np
import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.layouts.counts import Counts, validate_count_array

from ..conftest import skewed_counts


@pytest.mark.parametrize(
    "raw, message",
    [
        ([[1, 2], [3]], "rectangular"),
        (np.zeros((2, 2, 2, 2)), "must be [T, L, E] or [L, E]"),
        (np.zeros((0, 3)), "empty"),
        ([[1.5, 2.0]], "fractional value (expected integers) 1.5"),
        ([[1.0, float("nan")]], "non-finite"),
        ([[1, -3]], "negative value -3 "),
        ([[True, False]], "true/false values"),
        (np.array([[True, False]]), "must hold integers"),
        ([["a", "b"]], "str values"),
        ([[1, 2**60]], "above 9007199254740992, out of range"),
        ([[2**53, 2**53]], "sums to"),
    ],
)
def test_bad_counts_are_rejected_with_the_problem_named(raw, message):
    with pytest.raises(SceneEplbError) as exc:
        validate_count_array(raw, "x.json")
    assert message in str(exc.value)
    assert str(exc.value).startswith("x.json: ")


def test_integral_floats_are_accepted_as_int64_and_2d_gets_a_slot_axis():
    arr = validate_count_array([[1.0, 2.0], [0.0, 4.0]])
    assert arr.dtype == np.int64 and arr.shape == (1, 2, 2)
    assert arr.sum() == 7


def test_split_uses_written_entries_first_half_train():
    data = np.zeros((6, 2, 4), dtype=np.int64)
    data[[1, 2, 4]] = 1  # slots 0, 3 and 5 unwritten
    train, holdout = Counts(data).split()
    assert train.shape[0] == 2 and holdout.shape[0] == 1


def test_single_slot_has_no_holdout_and_dense_layers_are_detected():
    data = skewed_counts(1, 4, 8)
    data[:, 0] = 0
    c = Counts(data)
    train, holdout = c.split()
    assert holdout is None and train.shape[0] == 1
    assert c.active_layers().tolist() == [1, 2, 3]


def test_all_zero_counts_have_no_written_slot():
    c = Counts(np.zeros((3, 2, 4), dtype=np.int64))
    assert c.written_entries().size == 0
    train, holdout = c.split()
    assert holdout is None and train.sum() == 0


def _with_sources():
    data = skewed_counts(3, 2, 4, seed=2, top_k=1, tokens=16)
    total = data.sum(axis=0)
    sources = np.stack([total // 3, total - total // 3])  # two source ranks, each its own rows
    return data, sources


@pytest.mark.parametrize("fmt, suffix", [("scene-eplb", "npz"), ("sglang", "json"), ("pt", "pt")])
def test_per_source_counts_survive_every_counts_format(tmp_path, fmt, suffix):
    from vllm_scene_eplb.formats import read_counts, write_counts

    data, sources = _with_sources()
    back = read_counts(write_counts(Counts(data, {}, sources=sources), tmp_path / f"c.{suffix}", fmt))
    assert np.array_equal(back.data, data) and np.array_equal(back.sources, sources)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s[:, :1], r"source_count \[2, 1, 4\] does not match logical_count \[3, 2, 4\]"),
        (lambda s: s[0], r"source_count must be \[S, L, E\], got 2 dimension"),
        (lambda s: s + np.eye(4, dtype=np.int64)[None, :2], r"source_count holds \d+ assignments at \[L, E\] = \[0, 0\]"),
        (lambda s: s * -1, "negative value"),
    ],
)
def test_per_source_counts_that_do_not_add_up_are_refused(change, message):
    data, sources = _with_sources()
    with pytest.raises(SceneEplbError, match=message):
        Counts(data, {}, sources=change(sources))


def test_the_native_checksum_covers_the_per_source_counts(tmp_path):
    """Two sources' rows swapped keep every sum, so only the checksum can tell."""
    import zipfile

    from vllm_scene_eplb.formats import read_counts, write_counts

    data, sources = _with_sources()
    path = write_counts(Counts(data, {}, sources=sources), tmp_path / "c.npz", "scene-eplb")
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["source_count"] = arrays["source_count"][::-1]
    with zipfile.ZipFile(tmp_path / "bad.npz", "w") as zf:
        for name, arr in arrays.items():
            with zf.open(f"{name}.npy", "w") as fh:
                np.lib.format.write_array(fh, arr)
    with pytest.raises(SceneEplbError, match="checksum mismatch"):
        read_counts(tmp_path / "bad.npz")
