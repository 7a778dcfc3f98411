"""What advise checks before it speaks: the input's shapes, the evidence it needs, the timing
window's provenance, the running layout's model against what was measured, and the noise floor.

Each failed gate is ``insufficient_evidence`` with the reason in words (or, for input that does not
hold, a ``SceneEplbError``): no timing window with traffic, no measured replica traffic in the dump,
a timing window from another layout, geometry, role, ``steps_per_entry``, engine or plugin version
than the dump's, ranks that waited on a CPU run queue for more than ``MAX_WAIT_SHARE`` of their
steps, fewer than ``MIN_PASSES`` passes, a modelled critical path longer than the step, or a running
layout whose model disagrees with measurement by more than the noise floor. The noise floor is
measured: twice the robust spread of the timing window's sub-windows (the oldest, often a cold one,
dropped), or the ratio of an A/B of two identical setups passed in, or twice the model's residual on
the critical path, never under ``NOISE_FLOOR``. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SceneEplbError
from ..layouts.counts import Counts
from ..layouts.drafter import num_target_layers
from ..layouts.layout import Layout
from ..live.measured import fidelity
from ..protocol import PROVENANCE_KEYS, Advice, TimingWindow
from .model import TimeModel
from .prediction import Prediction, cycle_ms
from .setups import Setup

NOISE_FLOOR = 0.02  # the lower bound of the noise floor: below a 2% gain no single A/B here separates it
MIN_PASSES = 16  # fewer recorded passes than this give no per-pass distribution to speak of
# Above this share of a rank's step time spent waiting on a run queue (runnable, not running: other work
# on its core), the window's times hold contention that a layout moves (a cold rank's barrier slack absorbs
# it, a balanced layout puts it on the critical path), which the model does not price.
MAX_WAIT_SHARE = 0.05
# The sub-windows' spread: with at least this many the oldest is dropped (the first window after a start
# holds the warm-up and reads several times the rest); the spread is the median absolute deviation
# scaled to a normal sigma, so one outlier left does not set the floor.
DROP_OLDEST_FROM = 4
MAD_TO_SIGMA = 1.4826
# The provenance a dump must say (the timing window says every one of ``PROVENANCE_KEYS``).
REQUIRED_PROVENANCE = ("layout_hash", "ep_size", "role", "steps_per_entry")
NO_WINDOW = (
    "no timing window with traffic: start the running server with scene_eplb.time_moe true, record the scene "
    "(the stop's status carries the record's own window) and give that status (--url or --timing)"
)


def insufficient(reasons: list[str], *why: str, **details) -> Advice:
    """``insufficient_evidence`` after ``reasons``, saying ``why``, with the figures ``details``."""
    return Advice("insufficient_evidence", None, (*reasons, *why), details)


def check_shapes(counts: Counts, candidate: Layout, timing: TimingWindow | None) -> None:
    """The counts, the candidate and the timing window (where one is given) of one model and EP size
    (the target's layers: advise prices those; a drafter's rows on either side are not)."""
    layers = num_target_layers(counts)
    if counts.num_experts != candidate.geometry.num_experts or layers != candidate.num_target_layers:
        raise SceneEplbError(
            f"the candidate is for {candidate.geometry.num_experts} experts and {candidate.num_target_layers} layers, "
            f"the counts have {counts.num_experts} and {layers}"
        )
    if timing is None:
        return
    if timing.layers != len(candidate.moe_layers):
        raise SceneEplbError(f"the timing has {timing.layers} MoE layers, the candidate {len(candidate.moe_layers)}")
    if timing.ranks != candidate.geometry.ep_size:
        raise SceneEplbError(f"the timing has {timing.ranks} ranks, the candidate is for ep_size {candidate.geometry.ep_size}")


def provenance_mismatch(meta: dict, timing: TimingWindow) -> list[str]:
    """Where the timing window's provenance (every key said: ``TimingWindow``) and the dump's differ,
    in words (empty: they agree); a dump that leaves out a ``REQUIRED_PROVENANCE`` key is named."""
    out = [f"the dump does not say its {k}" for k in REQUIRED_PROVENANCE if k not in meta]
    said = timing.provenance
    out += [
        f"{k} is {meta[k]!r} in the dump, {said[k]!r} in the timing window"
        for k in PROVENANCE_KEYS
        if k in meta and said[k] != meta[k]
    ]
    return out


def evidence_gap(counts: Counts, timing: TimingWindow) -> str | None:
    """Why the dump and the timing window are not evidence to price (None: they are): no measured
    replica traffic, or a window from another server or setup than the dump's."""
    if counts.physical is None:
        return "the dump carries no measured replica traffic (physical_count): record it with this plugin version"
    mismatch = provenance_mismatch(counts.meta, timing)
    if mismatch:
        return "the timing window is not from the server and setup the dump was recorded on: " + "; ".join(mismatch)
    return None


def contended(timing: TimingWindow) -> str | None:
    """Why the window's times are not the MoE's alone (None: they are, or the ranks did not read their
    run-queue wait): a rank's stepping thread waited on a run queue above ``MAX_WAIT_SHARE`` of its steps."""
    share = timing.wait_share
    if share is None or share <= MAX_WAIT_SHARE:
        return None
    return (
        f"a rank waited on a CPU run queue for {share:.1%} of its step time in the timing window (wait_share, above "
        f"{MAX_WAIT_SHARE:.0%}): other work shares its cores, and that cost moves with the layout (a cold rank's "
        "barrier slack absorbs it, a balanced layout puts it on the critical path), which the model does not price; "
        "pin the API server, engine core and client away from the ranks' cores, or give the ranks cores of their own"
    )


def too_few_passes(passes: int, entries: int) -> str | None:
    """Why ``passes`` in ``entries`` written entries give no per-pass distribution and halves (None: they do)."""
    if passes >= MIN_PASSES and entries >= 2:
        return None
    return (
        f"the dump holds {passes} passes in {entries} written entries: at least {MIN_PASSES} passes in "
        "2 entries are needed for a per-pass distribution and the halves of the recording"
    )


def noise_floor(timing: TimingWindow, model: TimeModel, critical_now: float, ab_ratio: float | None) -> tuple[float, str]:
    """The floor a predicted gain must clear, and where it came from: the largest of ``NOISE_FLOOR``,
    twice the sub-windows' robust relative spread (``sub_window_spread``), the gap of an A/B between
    identical setups, and twice the model's residual on the critical path."""
    terms = {"the 2% lower bound": NOISE_FLOOR, "the time model's residual": 2 * model.residual * critical_now / cycle_ms(timing)}
    spread = sub_window_spread(timing.sub_windows)
    if spread is not None:
        terms[spread[1]] = 2 * spread[0]
    if ab_ratio is not None:
        terms[f"the A/B of two identical setups ({ab_ratio:.3f})"] = max(abs(ab_ratio - 1), abs(1 / ab_ratio - 1))
    source = max(terms, key=lambda k: terms[k])
    return terms[source], source


def sub_window_spread(step_ms) -> tuple[float, str] | None:
    """The relative spread of the sub-windows' step ms (oldest first) and what it is in words: with at
    least ``DROP_OLDEST_FROM`` the oldest dropped, then the median absolute deviation scaled to a
    normal sigma (``MAD_TO_SIGMA``) over the median; None with fewer than 3 left."""
    subs = np.asarray(step_ms, dtype=np.float64)
    dropped = subs.size >= DROP_OLDEST_FROM
    subs = subs[1:] if dropped else subs
    median = float(np.median(subs)) if subs.size else 0.0
    if subs.size < 3 or median <= 0:
        return None
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(subs - median)))
    oldest = ", the oldest dropped" if dropped else ""
    return (
        sigma / median,
        f"the robust spread (median absolute deviation x {MAD_TO_SIGMA}) of {subs.size} sub-windows' step time{oldest}",
    )


def unidentified(
    reasons: list[str], model: TimeModel, timing: TimingWindow, now: np.ndarray, cand: np.ndarray, ab_ratio
) -> Advice:
    """The window does not pin the slope down (its ranks' loads hardly differ, or time does not grow
    with them): the gain lies between none and what the steepest slope gives. ``skip`` if even that
    is under the noise floor, else ``insufficient_evidence``; ``now`` / ``cand``: per-pass rank loads."""
    bound = Prediction.of(model.steepest(), now, cand, np.zeros(len(now), dtype=np.int64), cycle_ms(timing))
    ratio = bound.ratio
    floor, source = noise_floor(timing, model.steepest(), bound.critical_now, ab_ratio)
    why = (
        f"MoE time does not grow with assignments in this timing window (pooled slope {model.pooled_b:+.3g} ms per assignment)"
        if model.pooled_b <= 0
        else f"the timing window does not pin the slope of time against assignments down (relative standard error "
        f"{model.slope_error:.0%}: its ranks computed too similar loads)"
    )
    details = {
        "step_ms": timing.step_ms,
        "gap_ms": timing.gap_ms,
        "wait_share": timing.wait_share,
        "noise_floor": floor,
        "noise_floor_source": source,
        "bound_ratio": ratio,
    }
    if ratio - 1 < floor:
        return Advice(
            "skip",
            None,
            (
                *reasons,
                f"{why}; even if all MoE time scaled with assignments the gain would be {ratio - 1:+.1%}, within the noise floor of {floor:.1%}",
            ),
            details,
        )
    return insufficient(
        reasons,
        f"{why}: the gain lies between none and {ratio - 1:+.1%}; time a window where the ranks' loads differ "
        "(the linear layout under the scene's load)",
        **details,
    )


@dataclass(frozen=True)
class ModelCheck:
    """The running layout's model against what was measured: its slot traffic against the dump's
    ``physical_count`` (``fidelity``), its slowest ranks' ms on the dump's mean pass modelled and from
    the measured traffic, and, at the timing window's own load per layer (its passes may be of
    another size than the dump's), its modelled rank shares against the window's measured slowest ranks
    (with a cost per active slot, the running layout's mean active slots per pass and the window's own);
    and where the record window measured its critical path pass by pass (``TimingWindow.critical_ms``),
    the per-pass price of the running layout against it (``per_pass_*``; None where not measured)."""

    fidelity: float | None
    mean_pass_modelled: float
    mean_pass_measured: float
    window_measured: float
    window_modelled: float
    per_pass_modelled: float | None = None
    per_pass_measured: float | None = None

    @classmethod
    def of(
        cls,
        counts: Counts,
        rows: list[int],
        now: Setup,
        model: TimeModel,
        passes: int,
        timing: TimingWindow,
        mean_active: np.ndarray | None = None,
        critical_now: float | None = None,
    ) -> ModelCheck:
        """The check of the running setup ``now`` on the dump's MoE ``rows`` over its ``passes`` passes;
        ``mean_active`` [L, ranks]: its mean active slots per pass (None: not priced); ``critical_now``:
        the prediction's per-pass price of it, held to the window's ``critical_ms`` where it has one."""
        written = counts.written_entries()
        assert counts.physical is not None  # evidence_gap refused a dump without it
        logical_total = counts.data[written][:, rows].sum(axis=0)
        modelled_slots = np.einsum("le,lep->lp", logical_total.astype(np.float64), now.operator)
        physical_total = counts.physical[written][:, rows].sum(axis=0)
        ep = now.geometry.ep_size
        modelled_ranks = modelled_slots.reshape(len(rows), ep, -1).sum(axis=2)
        measured_ranks = physical_total.reshape(len(rows), ep, -1).sum(axis=2).astype(np.float64)
        rank_share = modelled_ranks / np.maximum(modelled_ranks.sum(axis=1, keepdims=True), 1e-300)
        window_load = np.asarray(timing.rank_assignments, dtype=np.float64).sum(axis=0)  # [layers]
        window_active = None if timing.rank_active_slots is None else np.asarray(timing.rank_active_slots).T
        return cls(
            fidelity(physical_total, modelled_slots, now.p2l, now.geometry.num_experts),
            float(model.critical(modelled_ranks / passes, mean_active)),
            float(model.critical(measured_ranks / passes, mean_active)),
            float(np.asarray(timing.rank_ms).max(axis=0).sum()),
            float(model.critical(rank_share * window_load[:, None], window_active)),
            None if timing.critical_ms is None else critical_now,
            timing.critical_ms,
        )

    def details(self) -> dict:
        return {
            "fidelity_now": self.fidelity,
            "mean_pass_ms_modelled": self.mean_pass_modelled,
            "mean_pass_ms_measured": self.mean_pass_measured,
            "timing_window_slowest_ms": self.window_measured,
            "timing_window_slowest_ms_modelled": self.window_modelled,
            "per_pass_critical_ms_modelled": self.per_pass_modelled,
            "per_pass_critical_ms_measured": self.per_pass_measured,
        }

    def disagreement(self, step_ms: float, floor: float) -> str | None:
        """Where the model and the measurement differ by more than ``floor`` of the step, in words (None: they agree)."""
        fid = "n/a" if self.fidelity is None else f"{self.fidelity:.3f}"
        per_pass = []
        if self.per_pass_modelled is not None and self.per_pass_measured is not None:
            per_pass = [
                (
                    "the record's passes, each pass's slowest rank per layer (the per-pass price)",
                    "the critical path measured pass by pass",
                    self.per_pass_modelled,
                    self.per_pass_measured,
                )
            ]
        for where, what, modelled, measured in (
            ("the dump's mean pass", "its measured replica traffic", self.mean_pass_modelled, self.mean_pass_measured),
            (
                "the timing window's mean pass (its load, the modelled rank shares)",
                "the window measured",
                self.window_modelled,
                self.window_measured,
            ),
            *per_pass,
        ):
            if abs(modelled - measured) / step_ms > floor:
                return (
                    f"the running layout modelled from the logical counts gives {modelled:.3f} ms on the slowest ranks of "
                    f"{where}, {what} {measured:.3f} ms: {abs(modelled - measured) / step_ms:.1%} of the step, above the noise "
                    f"floor of {floor:.1%} (fidelity {fid}): the model does not describe this server"
                )
        return None


def longer_than_the_step(critical_now: float, timing: TimingWindow) -> str | None:
    """Why a modelled critical path ``critical_now`` longer than the window's step cannot be priced (None: it is not)."""
    if critical_now <= timing.step_ms:
        return None
    return (
        f"the modelled MoE critical path now ({critical_now:.2f} ms per pass) is longer than the whole step ({timing.step_ms:.2f} ms): "
        "the timing window and the dump do not describe the same passes"
        + ("" if timing.record else " (give the status the record's stop answered: its record_time is the record's own window)")
    )
