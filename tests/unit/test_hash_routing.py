"""DeepSeek-V4's hash layers: their tables read from a real (tiny) V4 checkpoint and checked against
the config, and their counts predicted exactly from tokens (what np.bincount of the routed ids gives)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.hash_layers.hash_routing import (
    HashTables,
    check_histogram,
    hash_layer_counts,
    predict_hash_counts,
    read_hash_tables,
    token_histogram,
)
from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, hf_config, make_tiny_deepseek_v4, random_weights

SPEC = TinyDeepseekV4Spec()


@pytest.fixture(scope="module")
def tiny_v4(tmp_path_factory) -> Path:
    return make_tiny_deepseek_v4(tmp_path_factory.mktemp("tiny-v4"), SPEC)


def _model(folder: Path, tables: dict[int, np.ndarray], **config) -> Path:
    """A model folder: the tiny V4's config (with ``config`` changes) and a checkpoint of ``tables`` alone."""
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**hf_config(SPEC), **config}))
    save_file({f"layers.{layer}.ffn.gate.tid2eid": t for layer, t in tables.items()}, str(folder / "model.safetensors"))
    return folder


def _tables(seed: int = 0, dtype=np.int32) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {layer: rng.integers(0, SPEC.num_experts, (SPEC.vocab_size, SPEC.top_k)).astype(dtype) for layer in SPEC.hash_layers}


def test_the_tables_are_the_checkpoints_tid2eid(tiny_v4):
    tables = read_hash_tables(tiny_v4)
    want = random_weights(SPEC)
    assert tables.layers == (0, 1, 2) and tables.tables.shape == (3, SPEC.vocab_size, SPEC.top_k)
    for i, layer in enumerate(tables.layers):
        assert np.array_equal(tables.tables[i], want[f"layers.{layer}.ffn.gate.tid2eid"].numpy())


def test_prediction_is_the_bincount_of_the_routed_ids(tiny_v4):
    tables = read_hash_tables(tiny_v4)
    ids = np.random.default_rng(1).integers(0, SPEC.vocab_size, 5000)
    requests = [ids[:1000].tolist(), [], ids[1000:].tolist()]
    got = predict_hash_counts(tiny_v4, requests)
    assert sorted(got) == [0, 1, 2]
    for i, layer in enumerate(tables.layers):
        want = np.bincount(tables.tables[i][ids].ravel(), minlength=SPEC.num_experts)
        assert got[layer].dtype == np.int64 and np.array_equal(got[layer], want)
    assert all(np.array_equal(a, b) for a, b in zip(got.values(), predict_hash_counts(tables, ids.reshape(50, 100)).values()))
    assert all(np.array_equal(a, b) for a, b in zip(got.values(), predict_hash_counts(tables, ids.tolist()).values()))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(1, 40),
    experts=st.integers(1, 12),
    top_k=st.integers(1, 4),
    layers=st.integers(1, 3),
    tokens=st.integers(0, 300),
)
def test_prediction_equals_bincount_on_random_tables_and_ids(seed, vocab, experts, top_k, layers, tokens):
    rng = np.random.default_rng(seed)
    tables = HashTables(tuple(range(layers)), rng.integers(0, experts, (layers, vocab, top_k)), experts)
    ids = rng.integers(0, vocab, tokens)
    got = hash_layer_counts(tables, token_histogram([ids], vocab))
    for i in range(layers):
        assert np.array_equal(got[i], np.bincount(tables.tables[i][ids].ravel(), minlength=experts))
    assert got.sum() == tokens * top_k * layers


def test_an_int64_table_reads_as_an_int32_one(tmp_path):
    a = read_hash_tables(_model(tmp_path / "a", _tables(dtype=np.int32)))
    b = read_hash_tables(_model(tmp_path / "b", _tables(dtype=np.int64)))
    assert np.array_equal(a.tables, b.tables) and a.digest() == b.digest()


@pytest.mark.parametrize(
    "tables, config, expected",
    [
        ({0: _tables()[0], 2: _tables()[2]}, {}, "no table for hash layer(s) [1] (layers.1.ffn.gate.tid2eid)"),
        ({**_tables(), 1: _tables()[1][:100]}, {}, "hash layer 1's table layers.1.ffn.gate.tid2eid has shape [100, 6]"),
        ({**_tables(), 2: _tables()[2][:, :4]}, {}, "has shape [512, 4], the config says [vocab_size 512, top_k 6]"),
        ({**_tables(), 0: _tables()[0].astype(np.float32)}, {}, "hash layer 0's table layers.0.ffn.gate.tid2eid is float32"),
        (
            {**_tables(), 1: np.where(np.arange(512)[:, None] == 77, 64, _tables()[1]).astype(np.int32)},
            {},
            "hash layer 1's table layers.1.ffn.gate.tid2eid routes token 77 to expert 64, outside [0, 64) (row 77",
        ),
        (
            {**_tables(), 0: np.where(np.arange(512)[:, None] == 3, -1, _tables()[0]).astype(np.int32)},
            {},
            "routes token 3 to expert -1",
        ),
        (_tables(), {"num_hash_layers": 0}, "config has no num_hash_layers"),
        (_tables(), {"vocab_size": None}, "config has no vocab_size"),
    ],
    ids=[
        "missing layer",
        "short vocab",
        "short row",
        "float table",
        "expert too high",
        "negative expert",
        "no hash layers",
        "no vocab",
    ],
)
def test_a_bad_table_or_config_is_named(tmp_path, tables, config, expected):
    with pytest.raises(SceneEplbError) as exc:
        read_hash_tables(_model(tmp_path / "m", tables, **config))
    assert expected in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "histogram, expected",
    [
        ([1, -2, 3], "token histogram has a negative value -2 at [token id] = [1]"),
        ([0] * 512 + [4], "counts token id 512, outside the vocabulary [0, 512)"),
        ([1, 1.5], "a fractional value"),
        ([1, "2"], "holds str values"),
        ([1, True], "holds true/false values"),
        ([[1, 2]], "must be [token id]"),
        ([2**53, 2**53], "above 2**53"),
    ],
    ids=["negative", "beyond the vocabulary", "fractional", "string", "boolean", "2-D", "too many tokens"],
)
def test_a_hostile_histogram_is_refused(histogram, expected):
    with pytest.raises(SceneEplbError, match=None) as exc:
        check_histogram(histogram, SPEC.vocab_size, "h.json")
    assert expected in str(exc.value)


def test_a_shorter_histogram_ends_in_zeros_and_trailing_zeros_past_the_vocabulary_are_dropped():
    assert check_histogram([3, 1], 4).tolist() == [3, 1, 0, 0]
    assert check_histogram([3, 1, 0, 0, 0, 0], 4).tolist() == [3, 1, 0, 0]


@pytest.mark.parametrize(
    "token_ids, expected",
    [
        ([[1, 2], [3, 512]], "request 1's token ids has a value above 511"),
        ([[1, 2], [-1]], "request 1's token ids has a negative value -1"),
        ([[1, 2.5]], "request 0's token ids has a fractional value"),
        ([[1], 7.0], "request 1 is float, not a list of token ids"),
        (np.array([0.5]), "fractional"),
    ],
    ids=["id past the vocabulary", "padding id -1", "fractional id", "not a request", "float array"],
)
def test_hostile_token_ids_are_refused_with_their_request(token_ids, expected):
    with pytest.raises(SceneEplbError) as exc:
        token_histogram(token_ids, SPEC.vocab_size)
    assert expected in str(exc.value)
