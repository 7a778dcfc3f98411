"""The counts files a scoring command reads (``read_scenes``) and how their scores are printed: the
summary text and the ``--json`` payload, one scene or several."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import SceneEplbError
from ..formats import read_counts
from ..formats.counts import PREDICTED_KEY
from ..layouts.counts import Counts
from ..layouts.drafter import drafter_layers_of, drafter_share
from ..layouts.evaluation import Evaluation, check_compatible, drafter_gap, evaluate_drafter
from ..layouts.layout import Layout
from .console import Console


def read_scenes(paths: list[str], console: Console, layout=None) -> list[Counts]:
    """Each counts file read and validated for fitting or scoring (some routing; given a layout, the
    layout's model shape), errors naming the file."""
    scenes = []
    for path in paths:
        with console.progress(f"reading {path}"):
            counts = read_counts(path)
        if not counts.data.any():
            raise SceneEplbError("every count is zero: nothing was routed (an empty record?), nothing to fit or score", path)
        if layout is not None:
            try:
                check_compatible(layout, counts)
            except SceneEplbError as exc:
                raise SceneEplbError(exc.problem, path) from None
        scenes.append(counts)
    return scenes


def summary_text(ev: Evaluation) -> str:
    """The score summary every scoring command prints: whether the layout was fitted on the scene,
    median and worst layer of each observed score, and one line for those not observed."""
    s = ev.summary()
    out = [
        f"layout {s['layout_hash']}  fingerprint {s['fingerprint'] or '-'}  MoE layers {s['layers']}  scene: {ev.scene_mark()}"
    ]
    out += [
        f"  {score.key:22s} median {s[score.key]['median']:.4f}  worst {s[score.key]['worst']:.4f}" for score in ev.observed()
    ]
    note = ev.not_observed()
    return "\n".join(out + ([f"  {note}"] if note else []))


def scene_names(paths: list[str]) -> list[str]:
    """A short, unique name per counts file (its stem; the path where stems repeat)."""
    stems = [Path(p).stem for p in paths]
    return [s if stems.count(s) == 1 else str(p) for s, p in zip(stems, paths)]


def scenes_payload(paths: list[str], evals: list[Evaluation], weights: list[float] | list[None] | None = None) -> dict:
    """The scores in ``--json``: ``summary`` and ``layers`` for one counts file; a ``scenes`` list
    (counts, name, weight, summary, layers) for several."""
    if len(evals) == 1:
        return {"summary": evals[0].summary(), "layers": evals[0].rows()}
    weights = weights or [None] * len(evals)
    return {
        "scenes": [
            {"counts": p, "name": n, "weight": w, "summary": ev.summary(), "layers": ev.rows()}
            for p, n, w, ev in zip(paths, scene_names(paths), weights, evals)
        ]
    }


def scenes_text(paths: list[str], evals: list[Evaluation]) -> str:
    """What vLLM's policy was fitted on, then the score summary of each scene, named when there are several."""
    if len(evals) == 1:
        return f"{evals[0].peer_line()}\n{summary_text(evals[0])}"
    return "\n".join([evals[0].peer_line()] + [f"scene {n}:\n{summary_text(ev)}" for n, ev in zip(scene_names(paths), evals)])


def layer_notes(counts: Counts, name: str, hash_layers: Sequence[int] = ()) -> list[str]:
    """What a counts file says of its layers beyond the counts: those predicted from tokens, not
    recorded (``hash-counts``), and the model's ``hash_layers`` left all zero (a recorder that missed
    them: SGLang #25961 recorded 40 of DeepSeek-V4-Flash's 43 layers)."""
    notes = []
    drafter = drafter_layers_of(counts)
    if drafter:
        notes.append(
            f"{name}: layers {list(drafter)} are a speculative drafter's own MoE layers, counted apart from the target's "
            f"({drafter_share([counts]):.1%} of the assignments): fitted and scored apart"
        )
    predicted = counts.meta.get(PREDICTED_KEY)
    if predicted:
        tokens = counts.meta.get("predicted_tokens")
        notes.append(f"{name}: layers {predicted} predicted from {tokens} tokens (hash-routed), not recorded")
    total = counts.total()
    empty = [layer for layer in hash_layers if layer < counts.num_layers and not total[layer].any()]
    if empty:
        notes.append(
            f"{name}: the model's hash layers {empty} are all zero (a recorder that missed them?): fill them "
            f"with `scene-eplb hash-counts MODEL --fill {name} --token-ids TOKENS -o FILLED`"
        )
    return notes


def unrouted_layers(scenes: Sequence[Counts], layers: Sequence[int]) -> list[int]:
    """The ``layers`` no scene routed anything in (the fitter gives them an even load)."""
    routed = np.sum([c.total() for c in scenes], axis=0).any(axis=1)
    return [int(layer) for layer in layers if not routed[layer]]


def drafter_scores(layout: Layout, scenes: list[Counts], paths: list[str]) -> tuple[dict | None, str]:
    """The drafter's MoE rows scored apart from the target's (``--json``'s ``drafter``: their layers
    and scores, or the note why none), and their text; (None, "") where neither side has drafter rows."""
    evals = evaluate_drafter(layout, scenes)
    if evals is None:
        note = drafter_gap(layout, scenes)
        return ({"note": note}, f"drafter: {note}") if note else (None, "")
    head = (
        f"the drafter's MoE layers {list(layout.drafter_layers)}, scored apart ({drafter_share(scenes):.1%} of the "
        "assignments: not mixed into the target's scores above):"
    )
    return {"drafter_layers": list(layout.drafter_layers), **scenes_payload(paths, evals)}, f"{head}\n{scenes_text(paths, evals)}"
