"""Human-readable reports: the old (linear) layout, vLLM's policy and the new layout side by side, a
Markdown table per layer and PNG heat maps of per-rank load."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import SceneEplbError
from ..fileio import atomic_write_files
from .counts import Counts
from .drafter import drafter_share
from .evaluation import Evaluation, evaluate, evaluate_drafter
from .layout import Layout, linear_map
from .peer import Peer, fit_peer
from .score import ideal_rank_loads, static_rank_loads


def _fmt(x) -> str:
    return f"{x:.4f}"


def _pair(st: dict) -> str:
    return f"{st['median']:.4f} / {st['worst']:.4f}"


def markdown(
    ev: Evaluation, layout: Layout, title: str = "Layout report", images: Sequence[str] = (), memory: str | None = None
) -> str:
    """A Markdown report: summary, then one row per MoE layer."""
    return "\n".join(_header(layout, ev, title, memory) + _scene_section(ev, images, level="##")) + "\n"


def _header(layout: Layout, ev: Evaluation, title: str, memory: str | None) -> list[str]:
    g = layout.geometry
    lines = [
        f"# {title}",
        "",
        f"- geometry: {g.num_experts} experts, {g.num_redundant} redundant slots, ep_size {g.ep_size}, "
        f"{g.num_nodes} node(s), {g.slots_per_rank} slots per rank",
        f"- layout hash: `{layout.digest()}`; fingerprint: `{layout.meta.get('fingerprint') or 'none'}`; "
        f"dispatch fitted for: {layout.meta.get('dispatch', 'unknown')}"
        + ("; static table: fitted (static_sources)" if layout.static_sources is not None else ""),
        f"- {ev.peer_line()}; vLLM splits an expert's tokens evenly over its replicas, so it is scored ideal",
        "- scores are max/mean rank load (1.0 = perfect), a screening number, not a device speedup;",
        "  holdout = the second half of the written ring entries, an internal check, not a generalisation proof;",
        "  a scene is *fitted on* where the layout was fitted on these counts (their digest in its metadata), else *out of scene*.",
    ]
    if memory:
        lines += ["", f"**Memory.** {memory}"]
    return lines + [""]


def _scene_section(ev: Evaluation, images: Sequence[str], level: str) -> list[str]:
    s = ev.summary()
    observed = ev.observed()
    note = ev.not_observed()
    lines = [
        f"{level} Scores",
        "",
        f"Scene: {ev.scene_mark()}. MoE layers scored: {s['layers']}; same-rank duplicates: old (linear) layout "
        f"{s['old_same_rank_duplicates']}, vLLM's policy {ev.peer_duplicates}",
        "",
        "| score | median | worst layer |",
        "|---|---|---|",
    ]
    lines += [f"| {score.label} | {_fmt(s[score.key]['median'])} | {_fmt(s[score.key]['worst'])} |" for score in observed]
    lines += ([""] + [note] if note else []) + [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in images] + [""]
    lines += [
        "| layer | " + " | ".join(score.column for score in observed) + " | max replicas | replicated experts |",
        "|---|" + "---|" * (len(observed) + 2),
    ]
    for r in ev.rows():
        lines.append(
            f"| {r['layer']} | "
            + " | ".join(_fmt(r[score.key]) for score in observed)
            + f" | {r['max_replicas']} | {r['replicated_experts']} |"
        )
    return lines + [""]


def scenes_markdown(scenes: list[tuple[str, Evaluation, str]], layout: Layout, memory: str | None = None) -> str:
    """A Markdown report over several scenes (name, evaluation, heat-map file): one table of every
    scene's headline scores (old, vLLM's policy, new), then each scene's section."""
    dispatch = layout.meta.get("dispatch", "dynamic")
    dispatch_key = "new_static_train" if dispatch == "static" else "new_train"
    lines = _header(layout, scenes[0][1], "Layout report: several scenes", memory) + [
        "## Scenes",
        "",
        "Median / worst MoE layer of each layout on each scene's train half.",
        "",
        f"| scene | new layout | old (linear) layout, ideal | vLLM's policy, ideal | new layout, {dispatch} dispatch |",
        "|---|---|---|---|---|",
    ]
    for name, ev, _ in scenes:
        s = ev.summary()
        lines.append(
            f"| {name} | {ev.scene_mark()} | {_pair(s['old_train'])} | {_pair(s['vllm_train'])} | {_pair(s[dispatch_key])} |"
        )
    lines.append("")
    for name, ev, png in scenes:
        lines += [f"## Scene {name}", ""] + _scene_section(ev, [png], level="###")
    return "\n".join(lines) + "\n"


def heatmap_png(layout: Layout, counts: Counts, peer: Peer, title: str = "") -> bytes:
    """PNG under ``title``: per-rank load / mean for every MoE layer: the old (linear) layout and
    vLLM's policy under an even split over replicas (what the tables call ideal), beside the new
    layout under the dispatch it was fitted for (static table, or the even split of dynamic)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SceneEplbError("heat maps need matplotlib (pip install 'vllm-scene-eplb[plots]')") from None
    g = layout.geometry
    layers = list(layout.moe_layers)
    w = counts.total()[layers].astype(np.float64)
    dispatch = layout.meta.get("dispatch", "dynamic")
    new = layout.physical_to_logical_map[layers]
    panels = [
        ("old (linear) layout", "ideal", ideal_rank_loads(linear_map(g, len(layers)), w, g)),
        ("vLLM's policy", "ideal", ideal_rank_loads(peer.map, w, g)),
        (
            "new layout",
            f"{dispatch} dispatch",
            static_rank_loads(new, w, g, layout.static_sources_at(layers))
            if dispatch == "static"
            else ideal_rank_loads(new, w, g),
        ),
    ]
    rel = []
    for _, _, loads in panels:
        mean = loads.mean(axis=1, keepdims=True)
        rel.append(np.divide(loads, mean, out=np.ones_like(loads), where=mean > 0))
    vmax = max(1.05, float(max(r.max() for r in rel)))
    fig, axes = plt.subplots(1, len(panels), figsize=(14, max(3.0, 0.12 * len(layers) + 1.5)), sharey=True)
    for ax, (name, how, _), r in zip(axes, panels, rel):
        im = ax.imshow(r, aspect="auto", cmap="magma", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"{name}\nmedian peak {np.median(r.max(axis=1)):.3f}, worst {r.max():.3f}")
        ax.set_xlabel(f"EP rank ({how})")
    axes[0].set_ylabel("MoE layer (row in layout)")
    axes[0].set_yticks(range(0, len(layers), max(1, len(layers) // 12)))
    axes[0].set_yticklabels([layers[i] for i in range(0, len(layers), max(1, len(layers) // 12))])
    fig.colorbar(im, ax=axes, label="rank load / mean")
    if title:
        fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def write_report(
    layout: Layout,
    scenes: list[tuple[str, Counts]],
    out_dir: str | os.PathLike,
    memory: str | None = None,
    expert_groups: int | None = None,
    groups_from: str = "",
) -> tuple[list[Evaluation], Path, list[Path]]:
    """Score ``layout`` beside the linear layout and vLLM's policy (fitted on the layout's own fit
    counts, ``fit_peer``; ``expert_groups`` from ``groups_from`` where given) on each (name, counts)
    scene and write ``report.md``, a heat map per scene (``rank_load_heatmap.png`` for one scene,
    ``rank_load_heatmap-NAME.png`` for several) and ``scores.json`` into ``out_dir``; returns the
    evaluations, the report and the heat maps. Every file is rendered before the first is written,
    so a failure leaves the folder as it was."""
    import json

    out = Path(out_dir)
    peer = fit_peer(layout, [counts for _, counts in scenes], expert_groups, groups_from)
    evals = [evaluate(layout, counts, peer) for _, counts in scenes]
    if len(scenes) == 1:
        png_names = ["rank_load_heatmap.png"]
        md = markdown(evals[0], layout, images=png_names, memory=memory)
        scores = {"summary": evals[0].summary(), "layers": evals[0].rows()}
    else:
        png_names = [f"rank_load_heatmap-{_file_safe(name)}.png" for name, _ in scenes]
        md = scenes_markdown([(n, ev, p) for (n, _), ev, p in zip(scenes, evals, png_names)], layout, memory)
        scores = {"scenes": [{"name": n, "summary": ev.summary(), "layers": ev.rows()} for (n, _), ev in zip(scenes, evals)]}
    files = {
        png: heatmap_png(layout, counts, peer, f"scene {name}: {ev.scene_mark()}")
        for png, (name, counts), ev in zip(png_names, scenes, evals)
    }
    drafter = evaluate_drafter(layout, [counts for _, counts in scenes])
    if drafter is not None:
        share = drafter_share([counts for _, counts in scenes])
        md += "\n".join(drafter_section(layout, [name for name, _ in scenes], drafter, share))
        scores["drafter"] = {
            "drafter_layers": list(layout.drafter_layers),
            "scenes": [{"name": n, "summary": ev.summary(), "layers": ev.rows()} for (n, _), ev in zip(scenes, drafter)],
        }
    files["scores.json"] = json.dumps(scores, indent=2).encode()
    files["report.md"] = md.encode()
    written = atomic_write_files(out, files)
    return evals, written["report.md"], [written[n] for n in png_names]


def drafter_section(layout: Layout, names: list[str], evals: list[Evaluation], share: float) -> list[str]:
    """The drafter's MoE rows, apart from the target's (``share`` of the assignments): each scene's section of their scores."""
    lines = [
        "## The drafter's MoE layers",
        "",
        f"Layers {list(layout.drafter_layers)}: a speculative drafter's own MoE layers, placed by rows of their own and "
        f"scored apart: {share:.1%} of the assignments, which the target's scores above leave out.",
        "",
    ]
    for name, ev in zip(names, evals):
        lines += ([f"### Scene {name}", ""] if len(evals) > 1 else []) + _scene_section(ev, (), level="####")
    return lines


def _file_safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
