"""Will a candidate layout pay in time, not only in counts? A count -> time model and a verdict.

From a running server's timing window (status ``live.time``: every rank's local expert ms per pass
and the assignments it computed per pass, per MoE layer, the step's wall ms and the MoE share) the
model fits, per layer, rank MoE time against assignments: t = a + b * n (least squares over the
ranks; a layer whose fit has no positive slope takes the fit pooled over all layers, since a
model's MoE layers share their shapes). From a dump recorded on the same server (its measured
replica traffic gives the running layout's per-rank loads; its logical counts give the candidate's
under its dispatch) it predicts each layer's slowest-rank time per pass, now and with the
candidate; every layer waits for its slowest rank, so their sum is the MoE critical path. The step
changes by the difference:

    predicted throughput ratio = step_ms / (step_ms - critical_now + critical_candidate)

Verdict: ``trial`` when the predicted gain is above the noise floor (2%, or twice the model's
relative residual on the critical path, whichever is larger) on the whole recording and on each of
its halves (the layout's gain is stable between the two halves of the recording); ``skip`` when
the prediction is within the noise or the halves disagree; ``insufficient_evidence`` without a
timing window with traffic, without measured replica traffic in the dump, or with fewer than two
recorded passes. Each reason is said in words. Pure numpy, no engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .counts import Counts
from .errors import SceneEplbError
from .layout import Layout
from .measured import rank_loads
from .score import ideal_rank_loads, static_rank_loads

NOISE_FLOOR = 0.02  # below a 2% predicted gain, no single A/B here separates it from noise (docs/benchmarks.md)
VERDICTS = ("trial", "skip", "insufficient_evidence")


@dataclass(frozen=True)
class TimeModel:
    """Per MoE layer t = a + b * n (ms per pass for n assignments on a rank), and the relative RMS
    residual of the fit on the points it came from."""

    a: np.ndarray
    b: np.ndarray
    residual: float

    def slowest(self, loads: np.ndarray) -> np.ndarray:
        """Slowest rank's predicted ms per pass of every layer, for per-rank loads [L, ranks]: [L]."""
        return (self.a[:, None] + self.b[:, None] * loads).max(axis=1)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares a, b of y = a + b x (b = 0 when x does not vary)."""
    if np.ptp(x) <= 0:
        return float(y.mean()), 0.0
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def fit_time_model(rank_ms: np.ndarray, rank_assignments: np.ndarray) -> TimeModel:
    """The model from a timing window: ms and assignments per pass, both [ranks, L]."""
    ms, n = np.asarray(rank_ms, dtype=np.float64), np.asarray(rank_assignments, dtype=np.float64)
    pooled = _line(n.ravel(), ms.ravel())
    a, b = np.empty(ms.shape[1]), np.empty(ms.shape[1])
    for layer in range(ms.shape[1]):
        a[layer], b[layer] = _line(n[:, layer], ms[:, layer])
        if b[layer] <= 0:
            a[layer], b[layer] = pooled
    fitted = a[None, :] + b[None, :] * n
    residual = float(np.sqrt(np.mean((fitted - ms) ** 2)) / max(float(ms.mean()), 1e-12))
    return TimeModel(a, b, residual)


def _per_pass(total: np.ndarray, passes: int) -> np.ndarray:
    return np.asarray(total, dtype=np.float64) / max(passes, 1)


def _candidate_loads(candidate: Layout, dispatch: str, logical: np.ndarray) -> np.ndarray:
    """The candidate's rank loads [L_moe, ep] for logical counts on its MoE rows."""
    rows = list(candidate.moe_layers)
    p2l, g = candidate.physical_to_logical_map[rows], candidate.geometry
    if dispatch == "static":
        return static_rank_loads(p2l, logical[rows], g, candidate.static_sources_at(rows))
    return ideal_rank_loads(p2l, logical[rows], g)


def _ratio(model: TimeModel, step_ms: float, now: np.ndarray, cand: np.ndarray) -> tuple[float, float, float]:
    """(predicted throughput ratio, critical ms now, critical ms with the candidate) for loads [L, ranks]."""
    c_now, c_cand = float(model.slowest(now).sum()), float(model.slowest(cand).sum())
    return step_ms / max(step_ms - c_now + c_cand, 1e-9), c_now, c_cand


def _split_loads(counts: Counts, candidate: Layout, dispatch: str, ranks: int, moe: list[int]):
    """Per-pass loads (now from measured traffic, candidate from logical counts) on the whole
    recording and on each half of its written entries (``counts`` with measured traffic)."""
    assert counts.physical is not None, "advise checks for physical_count first"
    written = counts.written_entries()
    half = (written.size + 1) // 2
    parts = {"recording": written, "first half": written[:half], "second half": written[half:]}
    out = {}
    for name, idx in parts.items():
        physical = counts.physical[idx].sum(axis=0)[moe]
        now = _per_pass(rank_loads(physical, ranks), idx.size)
        cand = _per_pass(_candidate_loads(candidate, dispatch, counts.data[idx].sum(axis=0)), idx.size)
        out[name] = (now, cand)
    return out


def advise(counts: Counts, candidate: Layout, dispatch: str, timing: dict | None, memory: str | None = None) -> dict:
    """The verdict (``VERDICTS``), the predicted throughput ratio and the reasons in words, plus the
    numbers behind them. ``timing`` is the status ``live.time`` object of the server the counts were
    recorded on; ``memory`` a sentence on what the candidate's redundant slots cost."""
    reasons: list[str] = []
    if memory:
        reasons.append(memory)
    if counts.num_experts != candidate.geometry.num_experts or counts.num_layers != candidate.num_layers:
        raise SceneEplbError(
            f"the candidate is for {candidate.geometry.num_experts} experts and {candidate.num_layers} layers, "
            f"the counts have {counts.num_experts} and {counts.num_layers}"
        )
    missing = None
    if not timing or not timing.get("rank_ms") or not timing.get("rank_assignments") or not timing.get("step_ms"):
        missing = (
            "no timing window with traffic and measured replica traffic: start the running server with "
            "scene_eplb.time_moe true, serve the scene for a live window, and give its status (--url or --timing)"
        )
    elif counts.physical is None:
        missing = "the dump carries no measured replica traffic (physical_count): record it with this plugin version"
    elif counts.written_entries().size < 2:
        missing = "the dump holds fewer than two recorded passes: the halves of the recording cannot be compared"
    if missing or timing is None or counts.physical is None:
        return {"verdict": "insufficient_evidence", "predicted_throughput_ratio": None, "reasons": reasons + [missing or ""]}
    rank_ms, assignments = np.asarray(timing["rank_ms"]), np.asarray(timing["rank_assignments"])
    ranks = rank_ms.shape[0]
    if ranks != candidate.geometry.ep_size:
        raise SceneEplbError(f"the timing has {ranks} ranks, the candidate is for ep_size {candidate.geometry.ep_size}")
    moe = list(candidate.moe_layers)
    model = fit_time_model(rank_ms, assignments)
    step_ms = float(timing["step_ms"])
    predictions = {
        name: _ratio(model, step_ms, now, cand)
        for name, (now, cand) in _split_loads(counts, candidate, dispatch, ranks, moe).items()
    }
    ratio, c_now, c_cand = predictions["recording"]
    floor = max(NOISE_FLOOR, 2 * model.residual * c_now / step_ms)
    share = timing.get("moe_share")
    reasons.append(
        f"count -> time model: per layer ms = a + b x assignments on a rank, fitted on {ranks} ranks x "
        f"{len(moe)} layers of the timing window (relative residual {model.residual:.1%})"
    )
    reasons.append(
        f"MoE critical path {c_now:.2f} ms per pass now, {c_cand:.2f} ms with the candidate, in a "
        f"{step_ms:.2f} ms step: predicted throughput ratio {ratio:.3f}"
    )
    if share is not None:
        reasons.append(f"MoE is {share:.1%} of step time here: no layout can save more than that share")
    halves = [predictions["first half"][0], predictions["second half"][0]]
    reasons.append(
        f"stability: predicted ratio {halves[0]:.3f} on the first half of the recording, {halves[1]:.3f} on the second"
    )
    if ratio - 1 < floor:
        verdict = "skip"
        reasons.append(f"predicted gain {ratio - 1:+.1%} is within the noise floor of {floor:.1%}: not worth a restart")
    elif min(halves) - 1 < floor:
        verdict = "skip"
        reasons.append(
            f"the gain does not hold on both halves of the recording (floor {floor:.1%}): the scene is not stable enough"
        )
    else:
        verdict = "trial"
        reasons.append(
            f"predicted gain {ratio - 1:+.1%} clears the noise floor of {floor:.1%} on the whole recording and both halves: "
            "try it, and measure with an A/B on the same load"
        )
    return {
        "verdict": verdict,
        "predicted_throughput_ratio": ratio,
        "reasons": reasons,
        "details": {
            "critical_ms_now": c_now,
            "critical_ms_candidate": c_cand,
            "step_ms": step_ms,
            "moe_share": share,
            "noise_floor": floor,
            "model_residual": model.residual,
            "halves": halves,
            "model": {"a": model.a.tolist(), "b": model.b.tolist()},
        },
    }
