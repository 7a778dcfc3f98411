import numpy as np
import pytest

from vllm_scene_eplb.counts import Counts, validate_count_array
from vllm_scene_eplb.errors import SceneEplbError

from .conftest import skewed_counts


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
