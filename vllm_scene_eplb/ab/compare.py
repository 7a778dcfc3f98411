"""`scene-eplb compare A B`: deltas between two bench results, with the field report's traps enforced.

- different N, C or r: refused (the runs measure different loads);
- more than one knob changed (layout, dispatch, redundant slots, recorder, model, lengths, ...): the
  delta is reported as the combined effect of the named knobs;
- a window under 60 s: flagged as not steady-state;
- a metric missing on either side: NOT_OBSERVED, and said;
- overlapping 95% confidence intervals: "within noise";
- gains of different comparisons are never added: each comparison stands alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SceneEplbError
from .charts import RatioBar, ratio_chart
from .results import HIGHER_IS_BETTER, METRICS, NOT_OBSERVED

LOAD_KEYS = ("num_prompts", "concurrency", "request_rate")
SCENE_KNOBS = ("input_len", "output_len", "prefix_share", "cards")
RUN_KNOBS = ("model", "quantization", "role", "chunk_size", "parallel", "ep_size", "recorder")


@dataclass
class Comparison:
    rows: list[dict]
    knobs: list[str]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "knobs_changed": self.knobs,
            "warnings": self.warnings,
            "deltas": self.rows,
            "note": "one comparison; gains of different comparisons are never added",
        }


def changed_knobs(ma: dict, mb: dict) -> list[str]:
    """Knobs that differ. The layout (hash and redundant slots) is one knob; the dispatch algorithm is
    a knob only when both runs load a layout (without one there are no replicas to dispatch over)."""
    knobs = [k for k in SCENE_KNOBS if ma["scene"].get(k) != mb["scene"].get(k)]
    knobs += [k for k in RUN_KNOBS if ma.get(k) != mb.get(k)]
    if (ma.get("layout_hash"), ma.get("redundant_slots")) != (mb.get("layout_hash"), mb.get("redundant_slots")):
        knobs.append("layout")
    if ma.get("layout_hash") and mb.get("layout_hash") and ma.get("dispatch") != mb.get("dispatch"):
        knobs.append("dispatch")
    return knobs


def compare(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Compare bench results ``a`` (reference) and ``b``; raises SceneEplbError when they measure different loads."""
    ma, mb = a["manifest"], b["manifest"]
    diff = [k for k in LOAD_KEYS if ma["scene"].get(k) != mb["scene"].get(k)]
    if diff:
        detail = ", ".join(f"{k} {ma['scene'].get(k)} vs {mb['scene'].get(k)}" for k in diff)
        raise SceneEplbError(f"refusing to compare runs with different load ({detail}): use the same N, C and r")
    knobs = changed_knobs(ma, mb)
    warnings = []
    if len(knobs) > 1:
        warnings.append(f"{len(knobs)} knobs changed ({', '.join(knobs)}): the deltas are their combined effect, not any one's")
    if not knobs:
        warnings.append("no knob differs between the manifests: the deltas are run-to-run noise")
    for name, doc in zip(names, (a, b)):
        agg = doc["aggregate"]
        if not agg.get("steady_state"):
            warnings.append(f"{name}: measurement window {agg.get('window_s')} s is under 60 s: not a steady-state result")
        if agg.get("failed"):
            warnings.append(f"{name}: {agg['failed']} request(s) failed")
        if doc["manifest"].get("recorder") == "recording":
            warnings.append(f"{name}: the recorder was on during the run")
    rows = []
    for m in METRICS:
        ra, rb = a["aggregate"].get(m, {}), b["aggregate"].get(m, {})
        va, vb = ra.get("mean", NOT_OBSERVED), rb.get("mean", NOT_OBSERVED)
        row = {
            "metric": m,
            names[0]: va,
            names[1]: vb,
            "ratio": NOT_OBSERVED,
            "delta_pct": NOT_OBSERVED,
            "verdict": NOT_OBSERVED,
            "ci95_" + names[0]: ra.get("ci95"),
            "ci95_" + names[1]: rb.get("ci95"),
        }
        if NOT_OBSERVED in (va, vb) or not va:
            warnings.append(f"{m}: not observed on {'both sides' if va == vb == NOT_OBSERVED else 'one side'}")
        else:
            row["ratio"] = vb / va
            row["delta_pct"] = 100.0 * (vb - va) / va
            ca, cb = ra.get("ci95"), rb.get("ci95")
            if ca is None or cb is None:
                row["verdict"] = "single run (no confidence interval)"
            elif abs(vb - va) <= ca + cb:
                row["verdict"] = "within noise"
            else:
                better = (vb > va) == HIGHER_IS_BETTER[m]
                row["verdict"] = f"{names[1]} {'better' if better else 'worse'}"
        rows.append(row)
    return Comparison(rows, knobs, warnings)


def _fmt(v) -> str:
    return v if isinstance(v, str) else f"{v:.4g}"


def markdown(c: Comparison, names: tuple[str, str] = ("A", "B")) -> str:
    lines = [f"| metric | {names[0]} | {names[1]} | {names[1]}/{names[0]} | delta % | verdict |", "|---|---|---|---|---|---|"]
    for r in c.rows:
        lines.append(
            f"| {r['metric']} | {_fmt(r[names[0]])} | {_fmt(r[names[1]])} | {_fmt(r['ratio'])} | {_fmt(r['delta_pct'])} | {r['verdict']} |"
        )
    lines.append("")
    lines.append(f"Knobs changed: {', '.join(c.knobs) or 'none'}.")
    lines += [f"- warning: {w}" for w in c.warnings]
    lines.append("- this is one comparison: gains of different comparisons are never added up")
    return "\n".join(lines) + "\n"


def chart_png(c: Comparison, names: tuple[str, str] = ("A", "B")) -> bytes:
    """Each observed metric as B/A with an interval from both sides' 95% CIs (none for single runs),
    a line at 1.0, throughputs and latencies on axes of their own."""
    bars = []
    for r in c.rows:
        if r["ratio"] == NOT_OBSERVED:
            continue
        ra, rb = r[names[0]], r[names[1]]
        ca, cb = r.get("ci95_" + names[0]), r.get("ci95_" + names[1])
        lo = hi = None
        if isinstance(ca, float) and isinstance(cb, float) and ra - ca > 0:
            lo, hi = (rb - cb) / (ra + ca), (rb + cb) / (ra - ca)
        bars.append(RatioBar(f"{names[1]}/{names[0]}", r["metric"], r["ratio"], lo, hi))
    return ratio_chart(bars, f"{names[1]} / {names[0]}")
