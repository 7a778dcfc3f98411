"""From counts to a validated ``Layout``: the stages on the counts' train half, with provenance.

``fit(counts, options) -> Layout``: checks the scenes, fits (``fit_scenes``), records what the
layout expects on its own scene(s), the scenes and weights, and a ``fingerprint`` (fitter version,
counts digests, options) that equal inputs reproduce exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import SceneEplbError
from ..fileio import canonical_json, sha256_hex
from ..layouts.counts import Counts
from ..layouts.drafter import drafter_layers_of, num_target_layers
from ..layouts.expected import EXPECTED_KEY, expected_score
from ..layouts.layout import Layout
from ..layouts.scenes import check_scenes, normalise_weights, normalised_totals
from .drafter_rows import DRAFTER_META, GUESS, guessed_rows
from .options import FITTER_VERSION, FitOptions
from .several_scenes import fit_scenes


def fingerprint(counts_digest: str, options: FitOptions, moe_layers: Sequence[int] | None = None, drafter_layers: int = 0) -> str:
    """Hash of fitter version, input counts and options (and the MoE rows, where a model gave others
    than the counts say, and drafter rows asked for beyond the counts): equal fingerprints mean equal layouts."""
    given: dict = {} if moe_layers is None else {"moe_layers": list(moe_layers)}
    if drafter_layers:
        given["drafter_layers"] = drafter_layers
    return sha256_hex(canonical_json({"fitter": FITTER_VERSION, "counts": counts_digest, "options": options.to_dict(), **given}))[
        :16
    ]


def fit(
    counts: Counts | Sequence[Counts],
    options: FitOptions,
    scene_weights: Sequence[float] | None = None,
    moe_layers: Sequence[int] | None = None,
    drafter_layers: int = 0,
) -> Layout:
    """Fit a layout to the train half of ``counts`` (all written ring entries if fewer than two),
    or to several scenes' train halves with ``scene_weights`` (default equal; see ``fit_scenes``).

    ``counts``: one ``Counts`` [T, L, E] or several of the same L and E; ``options.geometry``'s E
    must be theirs. Returns a ``Layout``: ``physical_to_logical_map`` [L, P] (P = E + R),
    ``static_sources`` [L, P] for ``static`` dispatch (else None), ``moe_layers`` as given (the
    model's), else from the counts' meta, else the rows with any routing, and ``meta``: ``fingerprint`` (fitter version, counts
    and options), ``fitter``, ``source_counts_sha256`` (one per scene), ``scene_weights`` [n],
    ``objective``, ``dispatch``, ``robust``, ``expert_groups``, ``model``, ``role`` (``mixed``
    where the scenes' differ) and ``EXPECTED_KEY``: the expected score on the scenes' mix (its
    dispatch, median and worst over the MoE layers).

    A drafter's MoE rows (``layouts.drafter``) in the counts are fitted from their own counts; a
    drafter row no scene routed, and ``drafter_layers`` rows appended to counts without any, get
    ``drafter_rows.hot_linear_row``; ``meta["drafter"]`` says which rows were fitted and which guessed.

    Example: counts [T, 61, 256] of DeepSeek-V3 (3 dense layers all zero, 58 MoE layers) fitted with
    ``FitOptions(Geometry(256, 16, 16))`` give a map [61, 272] whose ``moe_layers`` are rows 3..60."""
    g = options.geometry
    scenes = [counts] if isinstance(counts, Counts) else list(counts)
    check_scenes(scenes, g.num_experts)
    drafter = check_drafter_scenes(scenes, drafter_layers)
    weights = normalise_weights(scene_weights, len(scenes))
    fitted = fit_scenes([c.split()[0] for c in scenes], weights, options)
    first = scenes[0]
    named = first.meta.get("moe_layers")
    routed = np.sum([c.total() for c in scenes], axis=0).any(axis=1)
    target = num_target_layers(first)
    counted = tuple(named) if named is not None else tuple(int(i) for i in np.flatnonzero(routed[:target]))
    rows = counted if moe_layers is None else tuple(int(i) for i in moe_layers)
    mix = (weights[:, None, None] * normalised_totals([c.data for c in scenes])).sum(axis=0)
    digests = [c.digest() for c in scenes]
    roles = {c.meta.get("role") for c in scenes}
    guessed = [layer for layer in drafter if layer >= len(routed) or not routed[layer]]
    if guessed:
        fitted = guessed_rows(fitted, guessed, mix[list(rows)].sum(axis=0), g)
    layout = Layout(
        fitted.map,
        g,
        static_sources=fitted.static_sources,
        moe_layers=rows,
        drafter_layers=drafter,
        meta={
            "fingerprint": fingerprint(
                digests[0] if len(scenes) == 1 else sha256_hex(canonical_json([digests, weights.tolist()])),
                options,
                None if rows == counted else rows,
                drafter_layers,
            ),
            "fitter": FITTER_VERSION,
            "source_counts_sha256": digests,
            "scene_weights": weights.tolist(),
            "objective": options.objective,
            "dispatch": options.dispatch,
            "robust": options.robust,
            "expert_groups": options.expert_groups,
            "model": first.meta.get("model"),
            "role": roles.pop() if len(roles) == 1 else "mixed",
        },
    )
    if drafter:
        fitted_rows = [layer for layer in drafter if layer not in guessed]
        layout.meta[DRAFTER_META] = {
            "layers": list(drafter),
            "fitted": fitted_rows,
            "guessed": guessed,
            "guess": GUESS if guessed else None,
        }
    layout.meta[EXPECTED_KEY] = expected_score(layout, mix, options.dispatch)
    return layout


def check_drafter_scenes(scenes: Sequence[Counts], extra: int) -> tuple[int, ...]:
    """The layout's drafter rows: the scenes' (all the same), or ``extra`` appended to scenes with
    none; refuses scenes that disagree, and ``extra`` beside recorded drafter rows."""
    recorded = {drafter_layers_of(c) for c in scenes}
    if len(recorded) > 1:
        raise SceneEplbError(f"the counts files have different drafter layers {sorted(map(list, recorded))}: fit them apart")
    layers = recorded.pop()
    if extra and layers:
        raise SceneEplbError(f"--drafter-layers {extra}: the counts already have the drafter's rows {list(layers)}")
    n = scenes[0].num_layers
    return layers or tuple(range(n, n + extra))
