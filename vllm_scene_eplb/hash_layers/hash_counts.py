"""Counts files whose hash layers are predicted from tokens (``hash_routing``), not recorded: the
prediction alone, or filled into a record whose hash layers came out empty (SGLang #25961 recorded
40 of DeepSeek-V4-Flash's 43 layers).

The metadata says which layers are predicted (``predicted_layers``) from how many tokens; a
prediction alone holds one entry with every other MoE layer zero; a filled record keeps its
entries, the prediction split over them by their tokens (its sum over entries is exact).
"""

from __future__ import annotations

import numpy as np

from ..errors import SceneEplbError
from ..formats.counts import PREDICTED_KEY
from ..layouts.counts import Counts, counts_digest
from ..planning.model_geometry import ModelGeometry
from .hash_routing import HashTables, hash_layer_counts

TOKEN_RATIO_BAND = (0.9, 1.1)
"""The tokens given over the tokens a record routed per score-routed layer that ``--fill`` takes unasked:
1 when they are the record's own. 10% below leaves room for the tokens no client sees (a D node's
rejected drafts: 10% of what it computes at one draft a pass and 80% acceptance), as much above for
tokens given that the engine did not compute (each request's last sampled token). Sampled plus drafted
tokens (accepted drafts twice), another run's tokens or a record that kept a part of the run lie outside."""


def prediction_meta(geometry: ModelGeometry, tables: HashTables, histogram: np.ndarray, source: str) -> dict:
    """What a counts file says of its predicted layers: which, from how many tokens, which tokens
    (``source`` in words, the histogram's digest) and which tables."""
    return {
        PREDICTED_KEY: list(tables.layers),
        "predicted_tokens": int(histogram.sum()),
        "predicted_from": source,
        "tokens_sha256": counts_digest(histogram),
        "hash_tables_sha256": tables.digest(),
        "moe_layers": list(geometry.moe_layers),
        **geometry.routing(),
    }


def predicted_counts(geometry: ModelGeometry, tables: HashTables, histogram: np.ndarray, meta: dict) -> Counts:
    """One entry [1, L, E] over the model's layer axis: the hash layers' exact counts over
    ``histogram``'s tokens, every other layer zero (``meta`` says which are predicted)."""
    data = np.zeros((1, geometry.num_layers, geometry.num_experts), dtype=np.int64)
    data[0, list(tables.layers)] = hash_layer_counts(tables, histogram)
    return Counts(data, meta)


def apportion(total: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``total`` (int, any shape) split over len(``weights``) entries in proportion to the integer
    ``weights``: [T, *total.shape], each part within one of its exact share and the sums exact
    (largest remainder; ties go round the entries cell by cell, so no entry takes every odd unit)."""
    count, whole = len(weights), sum(int(x) for x in weights)
    exact = np.int64 if int(total.max(initial=0)) * whole * count < 2**63 else object  # Python integers past int64
    w = weights.astype(exact).reshape((-1,) + (1,) * total.ndim)
    product = total.astype(exact)[None] * w
    share, rest = product // whole, product % whole
    short = total.astype(exact) - share.sum(axis=0)  # how many entries of each cell get one more
    cell = np.arange(total.size).reshape(total.shape)
    turn = (np.arange(count).reshape(w.shape) - cell[None]) % count  # the tie-break, rotated per cell
    order = np.argsort(-(rest * count + turn), axis=0, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(count).reshape(w.shape), order.shape), axis=0)
    return (share + (rank < short[None])).astype(np.int64)


def fill_hash_layers(record: Counts, geometry: ModelGeometry, tables: HashTables, histogram: np.ndarray, meta: dict) -> Counts:
    """``record`` with its empty hash layers filled by the exact prediction over ``histogram``,
    split over the written entries by each entry's assignments in the score-routed layers (its
    tokens); measured slot and source counts are dropped (the prediction cannot split them)."""
    if (record.num_layers, record.num_experts) != (geometry.num_layers, geometry.num_experts):
        raise SceneEplbError(
            f"the record is [L={record.num_layers}, E={record.num_experts}], the model "
            f"[L={geometry.num_layers}, E={geometry.num_experts}]: not a record of this model"
        )
    hashed = list(tables.layers)
    held = int(record.data[:, hashed].sum())
    if held:
        raise SceneEplbError(f"the record's hash layers {hashed} hold {held} recorded assignments already: nothing to fill")
    scored = [layer for layer in geometry.moe_layers if layer not in tables.layers]
    per_entry = record.data[:, scored].sum(axis=(1, 2))
    if not per_entry.any():
        raise SceneEplbError("the record has no counts in the score-routed layers: nothing tells its entries' sizes")
    data = record.data.copy()
    written = np.flatnonzero(per_entry)
    data[np.ix_(written, np.array(hashed))] = apportion(hash_layer_counts(tables, histogram), per_entry[written])
    recorded = float(per_entry.sum()) / (tables.top_k * len(scored))
    return Counts(data, {**record.meta, **meta, "recorded_tokens": recorded})
