"""From counts to a validated ``Layout``: the stages on the counts' train half, with provenance.

``fit(counts, options) -> Layout``: checks the scenes, fits (``fit_scenes``), records what the
layout expects on its own scene(s), the scenes and weights, and a ``fingerprint`` (fitter version,
counts digests, options) that equal inputs reproduce exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..fileio import canonical_json, sha256_hex
from ..layouts.counts import Counts
from ..layouts.expected import EXPECTED_KEY, expected_score
from ..layouts.layout import Layout
from ..layouts.scenes import check_scenes, normalise_weights, normalised_totals
from .options import FITTER_VERSION, FitOptions
from .several_scenes import fit_scenes


def fingerprint(counts_digest: str, options: FitOptions, moe_layers: Sequence[int] | None = None) -> str:
    """Hash of fitter version, input counts and options (and the MoE rows, where a model gave others
    than the counts say): equal fingerprints mean equal layouts."""
    given = {} if moe_layers is None else {"moe_layers": list(moe_layers)}
    return sha256_hex(canonical_json({"fitter": FITTER_VERSION, "counts": counts_digest, "options": options.to_dict(), **given}))[
        :16
    ]


def fit(
    counts: Counts | Sequence[Counts],
    options: FitOptions,
    scene_weights: Sequence[float] | None = None,
    moe_layers: Sequence[int] | None = None,
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

    Example: counts [T, 61, 256] of DeepSeek-V3 (3 dense layers all zero, 58 MoE layers) fitted with
    ``FitOptions(Geometry(256, 16, 16))`` give a map [61, 272] whose ``moe_layers`` are rows 3..60."""
    g = options.geometry
    scenes = [counts] if isinstance(counts, Counts) else list(counts)
    check_scenes(scenes, g.num_experts)
    weights = normalise_weights(scene_weights, len(scenes))
    fitted = fit_scenes([c.split()[0] for c in scenes], weights, options)
    first = scenes[0]
    named = first.meta.get("moe_layers")
    routed = np.sum([c.total() for c in scenes], axis=0)
    counted = tuple(named) if named is not None else tuple(int(i) for i in np.flatnonzero(routed.any(axis=1)))
    rows = counted if moe_layers is None else tuple(int(i) for i in moe_layers)
    digests = [c.digest() for c in scenes]
    roles = {c.meta.get("role") for c in scenes}
    layout = Layout(
        fitted.map,
        g,
        static_sources=fitted.static_sources,
        moe_layers=rows,
        meta={
            "fingerprint": fingerprint(
                digests[0] if len(scenes) == 1 else sha256_hex(canonical_json([digests, weights.tolist()])),
                options,
                None if rows == counted else rows,
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
    mix = (weights[:, None, None] * normalised_totals([c.data for c in scenes])).sum(axis=0)
    layout.meta[EXPECTED_KEY] = expected_score(layout, mix, options.dispatch)
    return layout
