"""Where a prediction's error comes from, once the candidate has run: the running server's and the
candidate server's own timing windows against what ``advise`` predicted, as three separate numbers.

``advise`` predicts that only the MoE critical path changes (``prediction``):

    predicted = cycle_now / (cycle_now + dMoE_predicted)            cycle = step_ms + gap_ms

The candidate's own window says what did change. Each step of the chain below replaces one of the
prediction's assumptions by the measurement, so each factor is one cause:

    with_moe     = cycle_now / (cycle_now + dMoE_measured)           the MoE change as measured
    with_outside = cycle_now / cycle_candidate                       and the time outside MoE as measured
    windows      = with_outside x tokens_candidate / tokens_now      and the batch (tokens per pass)

``windows`` is the throughput ratio the two windows imply; what is left against the A/B's measured
ratio is the windows' load against the A/B's. The MoE critical path measured is the window's per
layer slowest rank's mean ms, summed (``TimingWindow.rank_ms``), on both sides, so its change is
like for like; tokens per pass are the window's assignments per pass over its ranks (top-k cancels).

A window holds means, so it is held to the model's slowest ranks at that window's own load: per
layer its assignments per pass split by the layout's modelled rank shares, with its own active
slots (``timing_window_slowest_ms_modelled`` for the running server, which ``advise`` checks; for
the candidate the same from ``candidate_rank_shares`` and the model's a, b and c).
``model_errors`` are the model's errors on each server, like for like (the per-pass critical path,
the expected slowest rank of each pass, is larger where passes are small; its change is what the
ratio prices). Where the record windows carry the critical path measured pass by pass
(``TimingWindow.critical_ms``: per pass the slowest rank of each layer), ``price_errors`` hold
``advise``'s per-pass prices to them: the running server's on the passes it priced (the dump's), the
candidate's on the candidate's own dump's passes where given (``priced_passes_ms``: the same model
at the candidate server's own load; else the running dump's passes, whose batch may differ). Pure numpy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import SceneEplbError
from ..layouts.counts import Counts
from ..layouts.layout import Layout
from ..protocol import TimingWindow
from .passes import DEFAULT_SEED, recorded_passes
from .prediction import cycle_ms
from .setups import Setup, source_shares


def window_critical_ms(window: TimingWindow) -> float:
    """The window's measured MoE critical path per pass: per layer its slowest rank's mean ms, summed."""
    return float(np.asarray(window.rank_ms).max(axis=0).sum())


def _model_ms(model: dict, loads: np.ndarray, active: np.ndarray | None) -> np.ndarray:
    """The model's (advise's ``details["model"]``: a [L], b [L], c) ms per rank for loads and active slots [..., L, ranks]."""
    ms = np.asarray(model["a"])[:, None] + np.asarray(model["b"])[:, None] * loads
    return ms if active is None else ms + float(model["c"]) * active


def modelled_window_ms(model: dict, shares: np.ndarray, window: TimingWindow) -> float:
    """The model's slowest ranks per layer, summed, at the window's own load per layer split by
    ``shares`` [L, ranks], with the window's active slots."""
    load = np.asarray(window.rank_assignments, dtype=np.float64).sum(axis=0)[:, None] * shares
    active = None if window.rank_active_slots is None else np.asarray(window.rank_active_slots, dtype=np.float64).T
    return float(_model_ms(model, load, active).max(axis=1).sum())


def priced_passes_ms(model: dict, counts: Counts, layout: Layout, dispatch: str, seed: int = DEFAULT_SEED) -> float:
    """The model's per-pass price of the MoE critical path on a dump's own passes (``recorded_passes``)
    under the layout and dispatch that dump ran: the mean over passes of each layer's slowest rank,
    summed, as ``advise`` prices (active slots priced where the model has a cost per slot)."""
    rows = list(layout.moe_layers)
    setup = Setup.of(layout, layout.geometry, dispatch, rows, source_shares(counts, rows, layout.geometry.ep_size))
    passes, _ = recorded_passes(counts, rows, seed)
    active = setup.rank_active(passes) if float(model["c"]) > 0 else None
    return float(_model_ms(model, setup.rank_loads(passes), active).max(axis=-1).sum(axis=-1).mean())


def tokens_per_pass(window: TimingWindow) -> float:
    """The window's assignments per pass, all ranks, mean over layers (tokens per pass x top-k)."""
    return float(np.asarray(window.rank_assignments).sum(axis=0).mean())


@dataclass(frozen=True)
class ErrorSplit:
    """A prediction against both servers' own windows: the MoE critical paths predicted (``advise``'s
    ``critical_ms_now`` / ``critical_ms_candidate``) and measured, each side's step, gap and time
    outside MoE (ms), its tokens per pass, and the chain of ratios the module docstring defines."""

    critical_predicted_now: float
    critical_predicted_candidate: float
    critical_measured_now: float
    critical_measured_candidate: float
    modelled_now: float
    modelled_candidate: float
    step_now: float
    step_candidate: float
    gap_now: float
    gap_candidate: float
    tokens_now: float
    tokens_candidate: float
    predicted: float
    with_moe: float
    with_outside: float
    windows: float
    measured: float | None
    per_pass_now: float | None = None
    per_pass_candidate: float | None = None
    priced_candidate_own: float | None = None

    @classmethod
    def of(
        cls,
        details: dict,
        now: TimingWindow,
        candidate: TimingWindow,
        measured: float | None = None,
        candidate_own: float | None = None,
    ) -> ErrorSplit:
        """From ``advise``'s details (which carry its critical paths wherever it fitted a model, an
        abstention on contention included), the running server's window ``now`` (the one ``advise``
        read) and the candidate server's own; ``measured``: the A/B's throughput ratio;
        ``candidate_own``: the model's per-pass price on the candidate's own dump (``priced_passes_ms``)."""
        try:
            pred_now, pred_cand = float(details["critical_ms_now"]), float(details["critical_ms_candidate"])
            mean_now = float(details["timing_window_slowest_ms_modelled"])
            shares = np.asarray(details["candidate_rank_shares"], dtype=np.float64)
            model = details["model"]
        except KeyError:
            raise SceneEplbError("advise fitted no time model (its details carry no critical paths): nothing to split") from None
        if not now.layers == candidate.layers == shares.shape[0]:
            raise SceneEplbError(
                f"the windows time {now.layers} and {candidate.layers} MoE layers, the advice {shares.shape[0]}: not one model"
            )
        mean_cand = modelled_window_ms(model, shares, candidate)
        c_now, c_cand = cycle_ms(now), cycle_ms(candidate)
        meas_now, meas_cand = window_critical_ms(now), window_critical_ms(candidate)
        tok_now, tok_cand = tokens_per_pass(now), tokens_per_pass(candidate)
        if min(c_now, c_cand, tok_now, tok_cand) <= 0:
            raise SceneEplbError("a window has no steps or no assignments: time both servers under load")
        with_outside = c_now / c_cand
        return cls(
            *(pred_now, pred_cand, meas_now, meas_cand, mean_now, mean_cand),
            *(now.step_ms, candidate.step_ms, now.gap_ms, candidate.gap_ms, tok_now, tok_cand),
            predicted=c_now / (c_now + pred_cand - pred_now),
            with_moe=c_now / (c_now + meas_cand - meas_now),
            with_outside=with_outside,
            windows=with_outside * tok_cand / tok_now,
            measured=measured,
            per_pass_now=now.critical_ms,
            per_pass_candidate=candidate.critical_ms,
            priced_candidate_own=candidate_own,
        )

    @property
    def outside_now(self) -> float:
        return self.step_now + self.gap_now - self.critical_measured_now

    @property
    def outside_candidate(self) -> float:
        return self.step_candidate + self.gap_candidate - self.critical_measured_candidate

    def factors(self) -> dict[str, float]:
        """Each cause's factor on the ratio (1: it moved nothing); their product is windows / predicted."""
        return {
            "moe": self.with_moe / self.predicted,
            "outside": self.with_outside / self.with_moe,
            "batch": self.windows / self.with_outside,
        }

    def model_errors(self) -> dict[str, float]:
        """The model's slowest ranks at each server's own window's load over that window's measured, less 1."""
        return {
            "now": self.modelled_now / self.critical_measured_now - 1,
            "candidate": self.modelled_candidate / self.critical_measured_candidate - 1,
        }

    def price_errors(self) -> dict[str, float | None]:
        """``advise``'s per-pass prices over each server's critical path measured pass by pass, less 1
        (None where that window did not log its passes): the candidate's price on its own passes
        where given, else on the running dump's."""
        pairs = {
            "now": (self.critical_predicted_now, self.per_pass_now),
            "candidate": (self.candidate_price, self.per_pass_candidate),
        }
        return {
            side: None if measured is None or measured <= 0 else price / measured - 1 for side, (price, measured) in pairs.items()
        }

    @property
    def candidate_price(self) -> float:
        """The candidate's per-pass price held to its own window: on its own passes where given."""
        return self.critical_predicted_candidate if self.priced_candidate_own is None else self.priced_candidate_own

    def to_dict(self) -> dict:
        extra = {
            "outside_now": self.outside_now,
            "outside_candidate": self.outside_candidate,
            "model_errors": self.model_errors(),
            "price_errors": self.price_errors(),
        }
        return {**asdict(self), **extra, **self.factors()}

    def lines(self) -> list[str]:
        """The split in words, a line per cause."""
        f, e, p = self.factors(), self.model_errors(), self.price_errors()
        tail = "" if self.measured is None else f"; the A/B measured {self.measured:.3f}"
        per_pass = [
            f"advise's price of the MoE critical path against each server's, measured pass by pass: running "
            f"{self.critical_predicted_now:.3f} priced, {_ms(self.per_pass_now)} measured ({_pct(p['now'])}); candidate "
            f"{self.candidate_price:.3f} priced{'' if self.priced_candidate_own is None else ' on its own passes'}, "
            f"{_ms(self.per_pass_candidate)} measured ({_pct(p['candidate'])})"
        ]
        return [
            f"predicted {self.predicted:.3f}: the MoE critical path {self.critical_predicted_now:.3f} -> "
            f"{self.critical_predicted_candidate:.3f} ms per pass in a {self.step_now:.2f} + {self.gap_now:.2f} ms cycle",
            f"the model on each server's own window (slowest ranks at its load): running {self.modelled_now:.3f} "
            f"modelled, {self.critical_measured_now:.3f} measured ({e['now']:+.1%}); candidate {self.modelled_candidate:.3f} "
            f"modelled, {self.critical_measured_candidate:.3f} measured ({e['candidate']:+.1%})",
            f"MoE: measured {self.critical_measured_now:.3f} -> {self.critical_measured_candidate:.3f} ms per pass: "
            f"x{f['moe']:.3f} -> {self.with_moe:.3f}",
            f"outside MoE: {self.outside_now:.2f} -> {self.outside_candidate:.2f} ms per step (step {self.step_now:.2f} -> "
            f"{self.step_candidate:.2f}, gap {self.gap_now:.2f} -> {self.gap_candidate:.2f}): x{f['outside']:.3f} -> {self.with_outside:.3f}",
            f"batch: {self.tokens_now:.1f} -> {self.tokens_candidate:.1f} assignments per pass: x{f['batch']:.3f} -> "
            f"{self.windows:.3f} (the windows' ratio){tail}",
            *(per_pass if self.per_pass_now is not None or self.per_pass_candidate is not None else []),
        ]


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"
