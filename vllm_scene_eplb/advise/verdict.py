"""The entry, ``advise()``: the gates, the model, the prediction and the verdict in words.

``trial`` when the predicted gain is above the noise floor on the whole recording and on each half
of its entries; ``skip`` when it is within the floor or the halves disagree; ``insufficient_evidence``
where a gate (``gates``) fails, each reason in words. Pure numpy, no engine.

``advise()`` runs the stages in the order their inputs allow, not the package docstring's: each
gate checks what the stage before it gave, so that a refused input never reaches a later stage
(the input's shapes and evidence; the setups and the passes, then enough passes; the base model,
then identified; the slot model and the prediction, then the model against measurement and the
step), and an input that more than one stage refuses gets the first refusal of this order.
"""

from __future__ import annotations

import numpy as np

from ..layouts.counts import Counts
from ..layouts.layout import Layout
from ..protocol import Advice, TimingWindow
from .gates import (
    MAX_WAIT_SHARE,
    NO_WINDOW,
    ModelCheck,
    check_shapes,
    contended,
    evidence_gap,
    insufficient,
    longer_than_the_step,
    noise_floor,
    too_few_passes,
    unidentified,
)
from .model import SLOTS_PRICED, fit_slot_model, fit_time_model
from .passes import DEFAULT_SEED, recorded_passes
from .prediction import Prediction, cycle_ms
from .setups import Setup, running_setup, source_shares

# How the model's reason names its window (``TimingWindow.record``).
WINDOW_KINDS = {True: "the record's own passes", False: "a live window, which may hold other passes than the dump's"}


def advise(
    counts: Counts,
    candidate: Layout,
    dispatch: str,
    timing: TimingWindow | None,
    memory: str | None = None,
    running: Layout | None = None,
    ab_ratio: float | None = None,
    seed: int = DEFAULT_SEED,
) -> Advice:
    """The advice (``protocol.Advice``): the verdict (``protocol.VERDICTS``), the predicted throughput
    ratio and the reasons in words, plus the numbers behind them. ``timing``: the running server's
    timing window (``TimingWindow``: a ``live.time`` object read with ``from_wire`` or ``of_status``;
    None: none); ``running``: the layout it runs (None: the linear layout, which the dump's metadata
    must then say); ``ab_ratio``: the throughput ratio of two identical setups, for the noise floor;
    ``memory``: what the candidate's redundant slots cost."""
    reasons: list[str] = [memory] if memory else []
    # gates: the input's shapes and the evidence
    check_shapes(counts, candidate, timing if isinstance(timing, TimingWindow) else None)
    if not isinstance(timing, TimingWindow):
        return insufficient(reasons, NO_WINDOW)
    gap = evidence_gap(counts, timing)
    if gap:
        return insufficient(reasons, gap)
    # setups and passes, then the gate on enough passes
    rows = list(candidate.moe_layers)
    shares = source_shares(counts, rows, candidate.geometry.ep_size)
    now = running_setup(counts, running, candidate, rows, shares)
    cand = Setup.of(candidate, candidate.geometry, dispatch, rows, shares)
    passes, origin = recorded_passes(counts, rows, seed)
    n_entries = counts.written_entries().size
    few = too_few_passes(passes.shape[0], n_entries)
    if few:
        return insufficient(reasons, few)
    # model: the base fit on the window (and both setups' rank loads), then the gates: contention, identification
    base = fit_time_model(np.asarray(timing.rank_ms), np.asarray(timing.rank_assignments))
    loads_now, loads_cand = now.rank_loads(passes), cand.rank_loads(passes)
    busy = contended(timing)  # an abstention, after the prediction where there is one: what it would have said
    if not base.identified:
        if busy:
            return insufficient(reasons, busy, wait_share=timing.wait_share, max_wait_share=MAX_WAIT_SHARE)
        return unidentified(reasons, base, timing, loads_now, loads_cand, ab_ratio)
    # model (the slot cost), prediction, then the gates on the model and the noise floor
    slots = fit_slot_model(
        base, np.asarray(timing.rank_ms), np.asarray(timing.rank_assignments), _active(timing), timing.pass_groups
    )
    model = slots.model
    active = None if timing.rank_active_slots is None else (now.rank_active(passes), cand.rank_active(passes))
    prediction = Prediction.of(model, loads_now, loads_cand, origin, cycle_ms(timing), active)
    floor, floor_source = noise_floor(timing, model, prediction.critical_now, ab_ratio)
    check = ModelCheck.of(
        counts,
        rows,
        now,
        model,
        passes.shape[0],
        timing,
        None if active is None else active[0].mean(axis=0),
        prediction.critical_now,
    )
    # verdict: the numbers and the reasons, the last refusals, then trial or skip
    numbers = {
        "critical_ms_now": prediction.critical_now,
        "critical_ms_candidate": prediction.critical_candidate,
        # the candidate's share of each layer's assignments per rank [L][ep]: with the model, what its own
        # window's means can be held to at that window's load (``error_split``)
        "candidate_rank_shares": (loads_cand.sum(axis=0) / np.maximum(loads_cand.sum(axis=(0, 2))[:, None], 1e-300)).tolist(),
        "step_ms": timing.step_ms,
        "gap_ms": timing.gap_ms,
        "moe_share": timing.moe_share,
        "wait_share": timing.wait_share,
        "max_wait_share": MAX_WAIT_SHARE,
        "noise_floor": floor,
        "noise_floor_source": floor_source,
        "model_residual": model.residual,
        "model": {"a": model.a.tolist(), "b": model.b.tolist(), "c": model.c, "slots": model.slots},
        "passes": int(passes.shape[0]),
        **check.details(),
    }
    priced = "a + b x assignments + c x active slots" if model.slots == SLOTS_PRICED else "a + b x assignments"
    reasons.append(
        f"count -> time model: per layer ms = {priced} on a rank, fitted on {timing.ranks} ranks x "
        f"{len(rows)} layers of the timing window ({WINDOW_KINDS[timing.record]}; relative residual {model.residual:.1%}); "
        f"{passes.shape[0]} passes from {n_entries} entries; {slots.why}"
    )
    refusal = busy or longer_than_the_step(prediction.critical_now, timing) or check.disagreement(timing.step_ms, floor)
    if refusal:
        return insufficient(reasons, refusal, **numbers)
    halves = prediction.halves(n_entries)
    verdict, why = _verdict(prediction.ratio, halves, floor, floor_source)
    lines = _prediction_lines(prediction, halves, timing)
    ratio = prediction.ratio
    if slots.bound is not None:
        bound = Prediction.of(slots.bound, loads_now, loads_cand, origin, cycle_ms(timing), active)
        other, _ = _verdict(bound.ratio, bound.halves(n_entries), floor, floor_source)
        numbers["bound_ratio"] = bound.ratio
        span = f"with c between 0 and {slots.bound.c:.4g} ms per active slot the ratio lies between {ratio:.3f} and {bound.ratio:.3f}"
        if other != verdict:
            return insufficient(
                reasons,
                *lines,
                f"{span}: {verdict} at one end, {other} at the other; time a window whose ranks' active slots differ "
                "apart from their assignments (several pass sizes, or the linear layout under a skewed scene)",
                **numbers,
            )
        ratio = min(ratio, bound.ratio) if verdict == "trial" else max(ratio, bound.ratio)
        lines.append(f"{span}: {verdict} at both ends, and the ratio given is the end the verdict was decided at ({ratio:.3f})")
    return Advice(verdict, ratio, (*reasons, *lines, why), {**numbers, "halves": halves})


def _active(timing: TimingWindow) -> np.ndarray | None:
    """The window's active slots per rank [ranks, L] (None where it carries none)."""
    return None if timing.rank_active_slots is None else np.asarray(timing.rank_active_slots)


def _prediction_lines(prediction: Prediction, halves: list[float], timing: TimingWindow) -> list[str]:
    """The prediction in words: both critical paths and the ratio, the MoE share, the halves."""
    lines = [
        f"MoE critical path {prediction.critical_now:.2f} ms per pass now, {prediction.critical_candidate:.2f} ms with "
        f"the candidate (expected slowest rank per pass, one model for both), in a {timing.step_ms:.2f} ms step and "
        f"{timing.gap_ms:.2f} ms between steps: predicted throughput ratio {prediction.ratio:.3f}"
    ]
    if timing.moe_share is not None:
        lines.append(f"MoE is {timing.moe_share:.1%} of step time here: no layout can save more than that share")
    lines.append(f"stability: predicted ratio {halves[0]:.3f} on the first half of the recording, {halves[1]:.3f} on the second")
    return lines


def _verdict(ratio: float, halves: list[float], floor: float, source: str) -> tuple[str, str]:
    """``trial`` when the gain clears ``floor`` on the whole recording and both halves, else ``skip``; and why."""
    if ratio - 1 < floor:
        return "skip", f"predicted gain {ratio - 1:+.1%} is within the noise floor of {floor:.1%} ({source}): not worth a restart"
    if min(halves) - 1 < floor:
        return (
            "skip",
            f"the gain does not hold on both halves of the recording (floor {floor:.1%}): the scene is not stable enough",
        )
    return "trial", (
        f"predicted gain {ratio - 1:+.1%} clears the noise floor of {floor:.1%} ({source}) on the whole recording "
        "and both halves: try it, and measure with an A/B on the same load"
    )
