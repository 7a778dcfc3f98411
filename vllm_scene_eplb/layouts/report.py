"""Human-readable reports: a Markdown table per layer and PNG heat maps of per-rank load."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import SceneEplbError
from ..fileio import atomic_write_files
from .counts import Counts
from .evaluation import SCORES, Evaluation, evaluate
from .layout import Layout, linear_map
from .score import ideal_rank_loads, static_rank_loads


def _fmt(x) -> str:
    return "NOT_OBSERVED" if x is None else f"{x:.4f}"


def markdown(
    ev: Evaluation, layout: Layout, title: str = "Layout report", images: Sequence[str] = (), memory: str | None = None
) -> str:
    """A Markdown report: summary, then one row per MoE layer."""
    return "\n".join(_header(layout, title, memory) + _scene_section(ev, images, level="##")) + "\n"


def _header(layout: Layout, title: str, memory: str | None) -> list[str]:
    g = layout.geometry
    lines = [
        f"# {title}",
        "",
        f"- geometry: {g.num_experts} experts, {g.num_redundant} redundant slots, ep_size {g.ep_size}, "
        f"{g.num_nodes} node(s), {g.slots_per_rank} slots per rank",
        f"- layout hash: `{layout.digest()}`; fingerprint: `{layout.meta.get('fingerprint') or 'none'}`; "
        f"dispatch fitted for: {layout.meta.get('dispatch', 'unknown')}"
        + ("; static table: fitted (static_sources)" if layout.static_sources is not None else ""),
        "- scores are max/mean rank load (1.0 = perfect), a screening number, not a device speedup;",
        "  holdout = the second half of the written ring entries, an internal check, not a generalisation proof.",
    ]
    if memory:
        lines += ["", f"**Memory.** {memory}"]
    return lines + [""]


def _scene_section(ev: Evaluation, images: Sequence[str], level: str) -> list[str]:
    s = ev.summary()
    lines = [
        f"{level} Scores",
        "",
        f"MoE layers scored: {s['layers']}; same-rank duplicates in the old (linear) layout: {s['old_same_rank_duplicates']}",
        "",
        "| score | median | worst layer |",
        "|---|---|---|",
    ]
    for score in SCORES:
        st = s[score.key]
        lines.append(f"| {score.label} | {_fmt(st and st['median'])} | {_fmt(st and st['worst'])} |")
    lines += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in images] + [""]
    lines += [
        "| layer | " + " | ".join(score.column for score in SCORES) + " | max replicas | replicated experts |",
        "|---|" + "---|" * (len(SCORES) + 2),
    ]
    for r in ev.rows():
        lines.append(
            f"| {r['layer']} | "
            + " | ".join(_fmt(r[score.key]) for score in SCORES)
            + f" | {r['max_replicas']} | {r['replicated_experts']} |"
        )
    return lines + [""]


def scenes_markdown(scenes: list[tuple[str, Evaluation, str]], layout: Layout, memory: str | None = None) -> str:
    """A Markdown report over several scenes (name, evaluation, heat-map file): one table of every
    scene's headline scores, then each scene's section."""
    dispatch_key = "new_static_train" if layout.meta.get("dispatch") == "static" else "new_train"
    lines = _header(layout, "Layout report: several scenes", memory) + [
        "## Scenes",
        "",
        f"| scene | old layout (ideal) median / worst | new layout ({layout.meta.get('dispatch', 'ideal')} dispatch) median / worst |",
        "|---|---|---|",
    ]
    for name, ev, _ in scenes:
        s = ev.summary()
        old, new = s["old_train"], s[dispatch_key]
        lines.append(f"| {name} | {old['median']:.4f} / {old['worst']:.4f} | {new['median']:.4f} / {new['worst']:.4f} |")
    lines.append("")
    for name, ev, png in scenes:
        lines += [f"## Scene {name}", ""] + _scene_section(ev, [png], level="###")
    return "\n".join(lines) + "\n"


def heatmap_png(layout: Layout, counts: Counts) -> bytes:
    """PNG: per-rank load / mean for every MoE layer, old (linear) layout beside the new one, under
    the dispatch the layout was fitted for (static table, or the even split of dynamic)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SceneEplbError("heat maps need matplotlib (pip install 'vllm-scene-eplb[plots]')") from None
    g = layout.geometry
    layers = list(layout.moe_layers)
    w = counts.total()[layers].astype(np.float64)
    sources = layout.static_sources_at(layers)
    panels = [
        ("old (linear) layout", linear_map(g, len(layers)), None),
        ("fitted layout", layout.physical_to_logical_map[layers], sources),
    ]
    dispatch = layout.meta.get("dispatch", "dynamic")
    rel = []
    for _, p2l, src in panels:
        loads = static_rank_loads(p2l, w, g, src) if dispatch == "static" else ideal_rank_loads(p2l, w, g)
        mean = loads.mean(axis=1, keepdims=True)
        rel.append(np.divide(loads, mean, out=np.ones_like(loads), where=mean > 0))
    vmax = max(1.05, float(max(r.max() for r in rel)))
    fig, axes = plt.subplots(1, 2, figsize=(10, max(3.0, 0.12 * len(layers) + 1.5)), sharey=True)
    for ax, (name, _, _), r in zip(axes, panels, rel):
        im = ax.imshow(r, aspect="auto", cmap="magma", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"{name}\nmedian peak {np.median(r.max(axis=1)):.3f}, worst {r.max():.3f}")
        ax.set_xlabel(f"EP rank ({dispatch} dispatch)")
    axes[0].set_ylabel("MoE layer (row in layout)")
    axes[0].set_yticks(range(0, len(layers), max(1, len(layers) // 12)))
    axes[0].set_yticklabels([layers[i] for i in range(0, len(layers), max(1, len(layers) // 12))])
    fig.colorbar(im, ax=axes, label="rank load / mean")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def write_report(
    layout: Layout, scenes: list[tuple[str, Counts]], out_dir: str | os.PathLike, memory: str | None = None
) -> tuple[list[Evaluation], Path, list[Path]]:
    """Score ``layout`` on each (name, counts) scene and write ``report.md``, a heat map per scene
    (``rank_load_heatmap.png`` for one scene, ``rank_load_heatmap-NAME.png`` for several) and
    ``scores.json`` into ``out_dir``; returns the evaluations, the report and the heat maps. Every
    file is rendered before the first is written, so a failure leaves the folder as it was."""
    import json

    out = Path(out_dir)
    evals = [evaluate(layout, counts) for _, counts in scenes]
    if len(scenes) == 1:
        png_names = ["rank_load_heatmap.png"]
        md = markdown(evals[0], layout, images=png_names, memory=memory)
        scores = {"summary": evals[0].summary(), "layers": evals[0].rows()}
    else:
        png_names = [f"rank_load_heatmap-{_file_safe(name)}.png" for name, _ in scenes]
        md = scenes_markdown([(n, ev, p) for (n, _), ev, p in zip(scenes, evals, png_names)], layout, memory)
        scores = {"scenes": [{"name": n, "summary": ev.summary(), "layers": ev.rows()} for (n, _), ev in zip(scenes, evals)]}
    files = {name: heatmap_png(layout, counts) for name, (_, counts) in zip(png_names, scenes)}
    files["scores.json"] = json.dumps(scores, indent=2).encode()
    files["report.md"] = md.encode()
    written = atomic_write_files(out, files)
    return evals, written["report.md"], [written[n] for n in png_names]


def _file_safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
