"""DeepSeek-V4's hash-routed MoE layers: their tables read from a checkpoint and checked against the
model's config, and their expert counts predicted exactly from the tokens a node computes.

A hash layer sends token t to the experts ``tid2eid[t]`` (a row of top_k expert ids; the checkpoint
tensor ``layers.N.ffn.gate.tid2eid`` [vocab, top_k]), whatever the hidden state, so its count of
expert e is ``sum_t histogram[t] * (times e appears in tid2eid[t])``: no server needs to run.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..arrays import integer_array
from ..errors import SceneEplbError
from ..fileio import canonical_json, sha256_hex
from ..formats.safetensors import read_checkpoint_tensors
from ..layouts.counts import MAX_TOTAL
from ..planning.model_files import ModelFiles, read_model
from ..planning.model_geometry import ModelGeometry

TABLE_NAME = "layers.{layer}.ffn.gate.tid2eid"  # DeepSeek's checkpoint name (vLLM loads it as an int32 parameter)


@dataclass(frozen=True)
class HashTables:
    """The checked tables of a model's hash layers: ``tables[i]`` [vocab, top_k] routes model layer
    ``layers[i]``; every id is in [0, num_experts)."""

    layers: tuple[int, ...]
    tables: np.ndarray  # int64 [H, vocab, top_k]
    num_experts: int

    @property
    def vocab(self) -> int:
        return int(self.tables.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.tables.shape[2])

    def digest(self) -> str:
        """SHA-256 of the layers and the tables' int64 bytes: which tables a prediction came from."""
        body = np.ascontiguousarray(self.tables, dtype="<i8").tobytes()
        return sha256_hex(canonical_json([list(self.layers), self.num_experts, list(self.tables.shape)]) + body)


def check_hash_table(
    raw: np.ndarray, layer: int, vocab: int, top_k: int, num_experts: int, path: str | None = None
) -> np.ndarray:
    """One layer's table as int64 [vocab, top_k], or the one-line refusal naming the layer and its
    first bad row (wrong shape, a dtype that is not an integer, an expert id outside [0, num_experts))."""
    what = f"hash layer {layer}'s table {TABLE_NAME.format(layer=layer)}"
    if raw.dtype.kind not in "iu":
        raise SceneEplbError(f"{what} is {raw.dtype}, expected integer expert ids", path)
    if raw.shape != (vocab, top_k):
        raise SceneEplbError(f"{what} has shape {list(raw.shape)}, the config says [vocab_size {vocab}, top_k {top_k}]", path)
    bad = (raw < 0) | (raw >= num_experts)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise SceneEplbError(
            f"{what} routes token {row} to expert {int(raw[row, col])}, outside [0, {num_experts}) (row {row}, column {col})",
            path,
        )
    return raw.astype(np.int64)


def model_hash_geometry(model: ModelFiles) -> tuple[ModelGeometry, int]:
    """A model's MoE geometry and vocabulary size; refuses a model without hash layers."""
    geometry = model.geometry
    if not geometry.hash_layers:
        raise SceneEplbError(
            "config has no num_hash_layers (nor mlp_layer_types' hash_moe): no layer routes by token id "
            "(DeepSeek-V4's hash layers)",
            model.where,
        )
    if geometry.top_k is None:
        raise SceneEplbError("config has no num_experts_per_tok: a hash table's row length is unknown", model.where)
    return geometry, model.fields().integer("vocab_size", 1, high=1 << 24)


def read_hash_tables(model: ModelFiles | str | os.PathLike) -> HashTables:
    """Every hash layer's table from a model (its folder or config.json, or the model read) and its
    safetensors, each checked against the config; a table the checkpoint lacks is named."""
    model = model if isinstance(model, ModelFiles) else read_model(model)
    geometry, vocab = model_hash_geometry(model)
    names = {layer: TABLE_NAME.format(layer=layer) for layer in geometry.hash_layers}
    found = read_checkpoint_tensors(model.folder, names.values())
    missing = [layer for layer, name in names.items() if name not in found]
    if missing:
        raise SceneEplbError(
            f"the checkpoint has no table for hash layer(s) {missing} ({names[missing[0]]}); the config says "
            f"every one of its {len(names)} hash layers routes by token id",
            model.folder,
        )
    top_k, experts = int(geometry.top_k or 0), geometry.num_experts
    tables = [check_hash_table(found[names[layer]], layer, vocab, top_k, experts, str(model.folder)) for layer in names]
    return HashTables(geometry.hash_layers, np.stack(tables), experts)


def check_histogram(raw: object, vocab: int, path: str | None = None) -> np.ndarray:
    """A token histogram (count of each token id, index = id) as int64 [vocab]: non-negative
    integers summing to at most 2**53, no token id at or above ``vocab`` (a shorter one ends in zeros)."""
    hist = integer_array(raw, "token histogram", path, 0, MAX_TOTAL, {1: "[token id]"})
    if hist.size > vocab:
        tail = np.flatnonzero(hist[vocab:])
        if tail.size:
            raise SceneEplbError(
                f"token histogram counts token id {vocab + int(tail[0])}, outside the vocabulary [0, {vocab})", path
            )
        hist = hist[:vocab]
    if float(hist.sum(dtype=np.float64)) > MAX_TOTAL:
        raise SceneEplbError(f"token histogram holds {float(hist.sum(dtype=np.float64)):.3g} tokens, above 2**53", path)
    return np.pad(hist, (0, vocab - hist.size))


def _requests(token_ids: Iterable[Sequence[int]] | np.ndarray, path: str | None) -> list:
    """``token_ids`` as a list of per-request sequences: an array is one (flattened), a flat list of
    integers is one, else each item is a request's list, tuple or array."""
    if isinstance(token_ids, np.ndarray):
        return [token_ids.ravel()]
    requests = list(token_ids)
    if requests and all(isinstance(x, (int, np.integer)) for x in requests):
        return [requests]
    for i, ids in enumerate(requests):
        if not isinstance(ids, (list, tuple, np.ndarray)):
            raise SceneEplbError(f"request {i} is {type(ids).__name__}, not a list of token ids", path)
    return requests


def token_histogram(token_ids: Iterable[Sequence[int]] | np.ndarray, vocab: int, path: str | None = None) -> np.ndarray:
    """The histogram [vocab] of token ids given as one numpy array (any shape, e.g. a batch's
    input_ids), one flat list, or one sequence per request (an empty one is a request with nothing to
    compute); an id outside [0, vocab) or a value that is not an integer is refused with its request
    and position."""
    hist = np.zeros(vocab, dtype=np.int64)
    for i, ids in enumerate(_requests(token_ids, path)):
        if len(ids) == 0:
            continue
        raw = ids if isinstance(ids, np.ndarray) else list(ids)
        hist += np.bincount(integer_array(raw, f"request {i}'s token ids", path, 0, vocab - 1, {1: "[token]"}), minlength=vocab)
    return check_histogram(hist, vocab, path)


def hash_layer_counts(tables: HashTables, histogram: np.ndarray) -> np.ndarray:
    """Exact int64 [H, E] counts of the hash layers over the tokens of ``histogram`` [vocab]: row i
    counts layer ``tables.layers[i]``; expert e gets histogram[t] for each time it appears in row t."""
    hist = check_histogram(histogram, tables.vocab)
    assignments = float(hist.sum(dtype=np.float64)) * tables.top_k * len(tables.layers)
    if assignments > MAX_TOTAL:
        raise SceneEplbError(f"{assignments:.3g} hash-layer assignments, above the 2**53 that sums of counts hold exactly")
    tokens = np.flatnonzero(hist)
    weights = np.repeat(hist[tokens], tables.top_k)
    out = np.zeros((len(tables.layers), tables.num_experts), dtype=np.int64)
    for i in range(len(tables.layers)):
        np.add.at(out[i], tables.tables[i, tokens].ravel(), weights)
    return out


def predict_hash_counts(
    model: str | os.PathLike | HashTables, token_ids: Iterable[Sequence[int]] | np.ndarray
) -> dict[int, np.ndarray]:
    """The exact expert counts of each hash layer (model layer -> int64 [E]) over ``token_ids`` (one
    array, or one sequence per request: the tokens the node computes, padding left out), from a
    model folder's checkpoint or from tables already read: what a recorder counts there."""
    tables = model if isinstance(model, HashTables) else read_hash_tables(model)
    counts = hash_layer_counts(tables, token_histogram(token_ids, tables.vocab))
    return dict(zip(tables.layers, counts))
