"""The counts files a scoring command reads (``read_scenes``), checked against ``--model`` or the model
they name (``check_model_counts``, ``moe_rows``, ``empty_layers``), and how their scores are printed:
the summary text and the ``--json`` payload, one scene or several."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..ab.warm import warm_line
from ..errors import SceneEplbError
from ..formats import read_counts
from ..formats.counts import PREDICTED_KEY, PREFIX_CACHE_KEY
from ..layouts.counts import Counts
from ..layouts.drafter import drafter_layers_of, drafter_share, num_target_layers
from ..layouts.evaluation import Evaluation, check_compatible, drafter_gap, evaluate_drafter
from ..layouts.layout import Layout
from ..planning.model_files import ModelFiles
from ..planning.model_geometry import known_model
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


def check_model_counts(model: ModelFiles, counts: Counts, path: str | Path) -> None:
    """Refuse counts of another model than ``--model``: another layer or expert count, MoE layers
    in their metadata that are not the model's, or routing in a layer the model says is dense (a
    drafter's rows after the model's layers are the drafter's, ``layouts.drafter``)."""
    g, problems, layers = model.geometry, [], num_target_layers(counts)
    if (layers, counts.num_experts) != (g.num_layers, g.num_experts):
        problems.append(f"the counts are [L={layers}, E={counts.num_experts}], the model [L={g.num_layers}, E={g.num_experts}]")
    else:
        named = counts.meta.get("moe_layers")
        if named is not None and tuple(named) != g.moe_layers:
            problems.append(f"the counts' metadata names MoE layers {named}, the model's are {list(g.moe_layers)}")
        dense = [int(layer) for layer in counts.active_layers() if int(layer) < layers and int(layer) not in g.moe_layers]
        if dense:
            problems.append(f"the counts route layers {dense} that the model says are dense")
    if problems:
        raise SceneEplbError(f"not counts of --model {model.folder}: " + "; ".join(problems), path)


@dataclass(frozen=True)
class MoeRows:
    """Which rows of the counts' layer axis are MoE layers, DeepSeek-V4's hash layers among them,
    and who says so (``source``: ``--model``, the counts' metadata or a known model's shape)."""

    layers: tuple[int, ...]
    hash_layers: tuple[int, ...]
    source: str


def moe_rows(scenes: Sequence[Counts], model: ModelFiles | None) -> MoeRows | None:
    """The MoE rows of ``scenes`` (of one shape): ``--model``'s, else the counts' metadata
    ``moe_layers`` (every scene that names them must agree), else those of the known model of their
    shape (``known_model``; it also names the hash layers), else None: every all-zero row is then
    taken for a dense layer."""
    if model is not None:
        return MoeRows(model.geometry.moe_layers, model.geometry.hash_layers, "--model")
    known = known_model(num_target_layers(scenes[0]), scenes[0].num_experts)
    named = {tuple(c.meta["moe_layers"]) for c in scenes if c.meta.get("moe_layers") is not None}
    if len(named) > 1:
        raise SceneEplbError(f"the counts files name different MoE layers in their metadata: {sorted(named)}")
    if named:
        layers = named.pop()
        hashed = tuple(layer for layer in known.geometry.hash_layers if layer in layers) if known else ()
        return MoeRows(layers, hashed, "the counts' metadata")
    if known:
        return MoeRows(known.geometry.moe_layers, known.geometry.hash_layers, known.describe())
    return None


def empty_layers(counts: Counts, rows: MoeRows | None) -> list[int]:
    """The MoE rows ``counts`` left all zero; none in a ``hash-counts`` prediction alone (its
    unpredicted layers are zero by design), but a record it filled is a record."""
    if rows is None:
        return []
    routed = np.asarray(counts.total().any(axis=1))
    predicted = counts.meta.get(PREDICTED_KEY) or []
    if predicted and not any(routed[layer] for layer in rows.layers if layer not in predicted):
        return []
    return [layer for layer in rows.layers if not routed[layer]]


def empty_layers_line(counts: Counts, name: str, rows: MoeRows | None, model: str | None) -> str | None:
    """What a counts file's empty MoE rows are, in one line: which, who says they are MoE layers and,
    for DeepSeek-V4's hash layers, the ``hash-counts`` line that fills them; None when there are none."""
    empty = empty_layers(counts, rows)
    if not empty or rows is None:
        return None
    line = f"{name}: MoE layers {empty} (per {rows.source}) are all zero (a recorder that missed them?)"
    hashed = [layer for layer in empty if layer in rows.hash_layers]
    if hashed:
        line += (
            f"; hash layers {hashed} route by token id: fill them with "
            f"`scene-eplb hash-counts --model {model or 'DIR'} --fill {name} --token-ids TOKENS -o FILLED`"
        )
    return line


def layer_notes(counts: Counts, name: str, rows: MoeRows | None = None, model: str | None = None) -> list[str]:
    """What a counts file says of its layers beyond the counts: those predicted from tokens, not
    recorded (``hash-counts``), and its MoE layers left all zero (``empty_layers_line``: a recorder
    that missed them, as SGLang #25961 recorded 40 of DeepSeek-V4-Flash's 43 layers)."""
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
    empty = empty_layers_line(counts, name, rows, model)
    if empty:
        notes.append(empty)
    return notes


def refuse_empty_layers(
    scenes: Sequence[Counts], paths: Sequence[str], rows: MoeRows | None, model: str | None, then: str
) -> None:
    """Refuse the first counts file with empty MoE rows, in one line that says what ``then``
    (``--allow-empty-layers``) would do instead."""
    for counts, path in zip(scenes, paths):
        line = empty_layers_line(counts, path, rows, model)
        if line:
            raise SceneEplbError(f"{line}; --allow-empty-layers {then}")


def warm_note(counts: Counts, name: str) -> str | None:
    """A warm record's measured prefix-cache hit share (``warm-check --stamp``), or None for any other."""
    meta = counts.meta.get(PREFIX_CACHE_KEY)
    if meta is None:
        return None
    try:
        return f"{name}: recorded warm, {warm_line(meta)}"
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, name) from None


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
