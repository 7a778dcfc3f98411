"""Will a candidate layout pay in time, not only in counts? A count -> time model, per pass, and a verdict.

**Time.** From the running server's timing window (``protocol.TimingWindow``: every rank's local
expert ms per pass and the assignments it computed per pass, per MoE layer, the step's wall ms;
best the record's own window, ``live.record_time``, which times exactly the dump's passes) the
model fits, per layer, rank MoE time against assignments, t = a + b * n (least squares over the
ranks; a layer whose fit has no positive slope takes the fit pooled over all layers, since a
model's MoE layers share their shapes). A window that does not pin the pooled slope down (not
positive, or its relative standard error above ``MAX_SLOPE_ERROR``: the ranks computed too similar
loads, as under a balanced layout) gives no ratio, only the bound of the steepest slope its mean
points allow (no fixed cost): ``skip`` when even that gain is under the noise floor, else
``insufficient_evidence``.

**Passes.** A ring entry holds ``steps_per_entry`` passes (the dump's metadata). The layout's cost
is the *expected slowest rank per pass*, not the slowest rank of the mean load: per-pass noise
makes the max of a pass larger than the max of the mean, and a layout balanced in aggregate gains
less per pass than it shows in aggregate. Entries of one pass are per-pass samples as they are. An
entry of k passes is split into its passes by the stated model: **its assignments are dealt into
k passes of equal size at random without replacement** (multivariate hypergeometric thinning,
seeded), which is exact when the passes' routing is exchangeable within the entry (each pass an
independent draw from the same distribution) and loses what is correlated inside a pass (one
prompt's tokens routed alike: the real per-pass max can then be larger). k for an entry is its
assignments over the tokens per pass of the metadata (``scheduled_tokens`` over the most
``passes_per_rank``, times ``top_k``), capped by ``steps_per_entry``, so a partly filled last
entry is not split into more passes than it held.

**One yardstick.** Every pass's logical counts go through a layout's dispatch to per-rank loads,
the same way for the running layout (its dispatch, from the dump's metadata) and for the
candidate: ``static`` sends each source rank's share of an expert to the slot its table row names
(the shares from the dump's per-source counts ``Counts.sources`` where it has them, else 1/ep per
source rank), ``dynamic`` 1/c to each of an expert's c replicas. Per pass and layer the slowest
rank's a + b * n; every layer waits for its slowest rank (a barrier per layer, no overlap of
layers), so their sum is the MoE critical path, and the step changes by the difference. A busy
engine's throughput pays for each step and for the pause before the next one (``gap_ms``:
scheduling, sampling, the API server's and the client's share of the machine, measured between
steps), which no layout changes, so the ratio is over their sum, the step's cycle:

    predicted throughput ratio = cycle_ms / (cycle_ms - critical_now + critical_candidate)
    cycle_ms = step_ms + gap_ms

The running layout's model is checked against what was measured: its modelled slot traffic against
the dump's measured replica traffic (fidelity, and the slowest ranks' ms on the mean pass), and its
rank shares at the timing window's own load against the window's measured slowest ranks (the window
and the dump may hold passes of other sizes, so the dump's mean pass is not the window's). Where they differ by more than the noise floor,
``insufficient_evidence`` with the numbers: the model does not describe this server.

**Verdict.** ``trial`` when the predicted gain is above the noise floor on the whole recording and
on each half of its entries; ``skip`` when it is within the floor or the halves disagree;
``insufficient_evidence`` (each reason in words) without a timing window or measured replica
traffic, with a timing window from another layout, geometry, role, ``steps_per_entry``, engine or
plugin version than the dump's, with fewer than ``MIN_PASSES`` passes, with a modelled critical
path longer than the step, or where the running layout's model disagrees with measurement. The
noise floor is measured: twice the spread of the timing window's sub-windows, or the ratio of an
A/B of two identical setups passed in, or twice the model's residual on the critical path, never
under 2%. Pure numpy, no engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .counts import Counts
from .dispatch import static_table
from .errors import SceneEplbError
from .layout import Geometry, Layout, linear_map, replica_counts
from .measured import fidelity
from .protocol import PROVENANCE_KEYS, Advice, TimingWindow

NOISE_FLOOR = 0.02  # the lower bound of the noise floor: below a 2% gain no single A/B here separates it
# How the model's reason names its window (``TimingWindow.record``).
WINDOW_KINDS = {True: "the record's own passes", False: "a live window, which may hold other passes than the dump's"}
MAX_SLOPE_ERROR = 0.25  # a pooled slope less certain than this is not identified by the window
MIN_PASSES = 16  # fewer recorded passes than this give no per-pass distribution to speak of
# The provenance a timing window must share with the dump (the rest is compared when both say it).
REQUIRED_PROVENANCE = ("layout_hash", "ep_size", "role", "steps_per_entry")
DEFAULT_SEED = 0


@dataclass(frozen=True)
class TimeModel:
    """Per MoE layer t = a + b * n (ms per pass for n assignments on a rank), the relative RMS
    residual of the fit on the points it came from, the slope pooled over all layers with its
    relative standard error, and ``b_max`` [L]: the steepest slope a layer's mean point allows
    with a non-negative fixed cost (all of its time proportional to assignments)."""

    a: np.ndarray
    b: np.ndarray
    residual: float
    pooled_b: float
    slope_error: float
    b_max: np.ndarray

    def rank_ms(self, loads: np.ndarray) -> np.ndarray:
        """Every rank's predicted ms for per-rank loads [..., L, ranks]: [..., L, ranks]."""
        return self.a[:, None] + self.b[:, None] * loads

    def critical(self, loads: np.ndarray) -> np.ndarray:
        """The MoE critical path (sum over layers of the slowest rank) for loads [..., L, ranks]: [...]."""
        return self.rank_ms(loads).max(axis=-1).sum(axis=-1)

    @property
    def identified(self) -> bool:
        """Whether the window pins the slope down: positive, with a relative standard error of at most ``MAX_SLOPE_ERROR``."""
        return self.pooled_b > 0 and self.slope_error <= MAX_SLOPE_ERROR

    def steepest(self) -> TimeModel:
        """The bound: no fixed cost, every layer at its ``b_max`` (the largest gain the window allows)."""
        return TimeModel(np.zeros_like(self.a), self.b_max, self.residual, self.pooled_b, self.slope_error, self.b_max)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares a, b of y = a + b x (b = 0 when x does not vary)."""
    if np.ptp(x) <= 0:
        return float(y.mean()), 0.0
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def _slope_error(x: np.ndarray, y: np.ndarray, a: float, b: float) -> float:
    """The least-squares slope's standard error over |b|: inf without spread in x or with b = 0;
    with two points, 0 (a line through both) or inf."""
    spread = float(((x - x.mean()) ** 2).sum())
    if spread <= 0 or b == 0:
        return float("inf")
    residual = float(((a + b * x - y) ** 2).sum())
    if x.size < 3:
        return 0.0 if residual <= 1e-18 else float("inf")
    return float(np.sqrt(residual / (x.size - 2) / spread) / abs(b))


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
    b_max = ms.mean(axis=0) / np.maximum(n.mean(axis=0), 1e-12)
    return TimeModel(a, b, residual, pooled[1], _slope_error(n.ravel(), ms.ravel(), *pooled), b_max)


# ---------------------------------------------------------------- passes


def _meta_int(meta: dict, key: str, default: int | None) -> int | None:
    value = meta.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SceneEplbError(f"the dump's metadata {key} must be a positive integer, got {value!r}")
    return value


def passes_per_entry(counts: Counts, rows: list[int]) -> np.ndarray:
    """How many passes each written entry holds: int [n_written] (see the module docstring)."""
    meta = counts.meta
    k = _meta_int(meta, "steps_per_entry", 1) or 1
    written = counts.written_entries()
    if k == 1:
        return np.ones(written.size, dtype=np.int64)
    per_rank, tokens, top_k = meta.get("passes_per_rank"), meta.get("scheduled_tokens"), meta.get("top_k")
    passes = max(per_rank) if isinstance(per_rank, list) and per_rank and all(isinstance(p, int) for p in per_rank) else 0
    if not (passes > 0 and isinstance(tokens, int) and tokens > 0 and isinstance(top_k, int) and top_k > 0):
        return np.full(written.size, k, dtype=np.int64)
    per_pass = tokens / passes * top_k  # assignments per layer in one pass
    entry = counts.data[written][:, rows].sum(axis=2).max(axis=1)
    return np.clip(np.rint(entry / per_pass), 1, k).astype(np.int64)


def split_passes(entries: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """Entries' counts [n, L, E] dealt into ``m`` passes each of equal size (per layer, the remainder
    to the first passes) at random without replacement: int [n, m, L, E] summing back to ``entries``."""
    pool = np.array(entries, dtype=np.int64)
    n, L, E = pool.shape
    if m == 1:
        return pool[:, None]
    if pool.sum(axis=2).max() >= 10**9:
        raise SceneEplbError("a ring entry holds 10^9 or more assignments in one layer: not a recording of passes")
    out = np.zeros((n, m, L, E), dtype=np.int64)
    total = pool.sum(axis=2)  # [n, L]
    for j in range(m - 1):
        need = total // (m - j) + (total % (m - j) > 0)  # this pass's size, the larger ones first
        rest = total.copy()
        for e in range(E):
            good = pool[:, :, e]
            take = rng.hypergeometric(good, rest - good, need) if need.any() else np.zeros_like(need)
            out[:, j, :, e] = take
            need, rest = need - take, rest - good
        pool -= out[:, j]
        total = pool.sum(axis=2)
    out[:, m - 1] = pool
    return out


def recorded_passes(counts: Counts, rows: list[int], seed: int = DEFAULT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Every pass of the recording, the MoE rows only: logical counts [n, L_moe, E] and the written
    entry each pass came from [n] (the entries' order, for the halves)."""
    written = counts.written_entries()
    m = passes_per_entry(counts, rows)
    rng = np.random.default_rng(seed)
    parts, origin = [], []
    for k in np.unique(m):
        idx = np.flatnonzero(m == k)
        split = split_passes(counts.data[written[idx]][:, rows], int(k), rng)  # [len(idx), k, L, E]
        parts.append(split.reshape(-1, *split.shape[2:]))
        origin.append(np.repeat(idx, k))
    order = np.argsort(np.concatenate(origin), kind="stable")
    return np.concatenate(parts)[order], np.concatenate(origin)[order]


# ---------------------------------------------------------------- dispatch as an operator


def slot_operator(p2l: np.ndarray, geometry: Geometry, dispatch: str, static_sources, shares: np.ndarray | None):
    """The share of every expert's assignments each slot gets: float [L, E, P] for map rows ``p2l``
    [L, P]. ``static``: source rank s's share ``shares`` [S, L, E] (None: 1/ep each) of expert e to
    the slot ``static_table`` names for (s, e); otherwise 1/c to each of the c replicas."""
    L, P = p2l.shape
    E, ep = geometry.num_experts, geometry.ep_size
    out = np.zeros((L, E, P))
    if dispatch == "static":
        table = static_table(p2l, geometry, static_sources)  # [L, ep, E]
        share = np.full((ep, L, E), 1.0 / ep) if shares is None else shares
        layers = np.broadcast_to(np.arange(L)[None, :, None], (ep, L, E))
        experts = np.broadcast_to(np.arange(E)[None, None, :], (ep, L, E))
        np.add.at(out, (layers, experts, table.transpose(1, 0, 2)), share)
        return out
    replicas = replica_counts(p2l, E)
    rows = np.repeat(np.arange(L), P)
    out[rows, p2l.ravel(), np.tile(np.arange(P), L)] = 1.0 / np.maximum(replicas[rows, p2l.ravel()], 1)
    return out


def source_shares(counts: Counts, rows: list[int], ep_size: int) -> np.ndarray | None:
    """Each source rank's share of every expert's recorded assignments [S, L_moe, E] from the dump's
    per-source counts; None without them (the even split then stands: 1/ep per source rank)."""
    if counts.sources is None:
        return None
    src = np.asarray(counts.sources, dtype=np.float64)[:, rows]
    if src.shape[0] != ep_size:
        raise SceneEplbError(
            f"the dump's per-source counts are for {src.shape[0]} source ranks, the layout for ep_size {ep_size}"
        )
    total = src.sum(axis=0, keepdims=True)
    even = np.full_like(src, 1.0 / ep_size)
    return np.where(total > 0, src / np.where(total > 0, total, 1.0), even)


@dataclass(frozen=True)
class Setup:
    """A layout as advise prices it: its map rows [L_moe, P], geometry, dispatch and slot operator [L_moe, E, P]."""

    p2l: np.ndarray
    geometry: Geometry
    dispatch: str
    operator: np.ndarray

    @classmethod
    def of(cls, layout: Layout | None, geometry: Geometry, dispatch: str, rows: list[int], shares) -> Setup:
        """``layout`` (None: the linear layout of ``geometry``) on the MoE ``rows``."""
        if layout is None:
            p2l, static_sources = linear_map(geometry, len(rows)), None
        else:
            p2l, static_sources = layout.physical_to_logical_map[rows], layout.static_sources_at(rows)
        return cls(p2l, geometry, dispatch, slot_operator(p2l, geometry, dispatch, static_sources, shares))

    def rank_loads(self, logical: np.ndarray) -> np.ndarray:
        """Per-rank loads [..., L, ep] of logical counts [..., L, E]."""
        g = self.geometry
        rank_op = self.operator.reshape(*self.operator.shape[:2], g.ep_size, g.slots_per_rank).sum(axis=3)
        return np.einsum("...le,ler->...lr", np.asarray(logical, dtype=np.float64), rank_op)


# ---------------------------------------------------------------- gates and the verdict


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


def noise_floor(timing: TimingWindow, model: TimeModel, critical_now: float, ab_ratio: float | None) -> tuple[float, str]:
    """The floor a predicted gain must clear, and where it came from: the largest of ``NOISE_FLOOR``,
    twice the coefficient of variation of the sub-windows' step ms (at least 3 of them), the gap of
    an A/B between identical setups, and twice the model's residual on the critical path."""
    terms = {"the 2% lower bound": NOISE_FLOOR, "the time model's residual": 2 * model.residual * critical_now / cycle_ms(timing)}
    subs = np.asarray(timing.sub_windows, dtype=np.float64)
    if subs.size >= 3 and subs.mean() > 0:
        terms[f"the spread of {subs.size} sub-windows' step time"] = 2 * float(subs.std(ddof=1) / subs.mean())
    if ab_ratio is not None:
        terms[f"the A/B of two identical setups ({ab_ratio:.3f})"] = max(abs(ab_ratio - 1), abs(1 / ab_ratio - 1))
    source = max(terms, key=lambda k: terms[k])
    return terms[source], source


def cycle_ms(timing: TimingWindow) -> float:
    """A busy step's cycle: the step and the pause before the next one (what each step's throughput pays)."""
    return timing.step_ms + timing.gap_ms


def throughput_ratio(cycle: float, critical_now: float, critical_candidate: float) -> float:
    """The candidate's throughput over the running layout's when only the MoE critical path changes."""
    return cycle / max(cycle - critical_now + critical_candidate, 1e-9)


def _insufficient(reasons: list[str], *why: str, **details) -> Advice:
    return Advice("insufficient_evidence", None, (*reasons, *why), details)


def _unidentified(
    reasons: list[str], model: TimeModel, timing: TimingWindow, now: np.ndarray, cand: np.ndarray, ab_ratio
) -> Advice:
    """The window does not pin the slope down (its ranks' loads hardly differ, or time does not grow
    with them): the gain lies between none and what the steepest slope gives. ``skip`` if even that
    is under the noise floor, else ``insufficient_evidence``; ``now`` / ``cand``: per-pass rank loads."""
    bound = model.steepest()
    c_now, c_cand = float(bound.critical(now).mean()), float(bound.critical(cand).mean())
    ratio = throughput_ratio(cycle_ms(timing), c_now, c_cand)
    floor, source = noise_floor(timing, bound, c_now, ab_ratio)
    why = (
        f"MoE time does not grow with assignments in this timing window (pooled slope {model.pooled_b:+.3g} ms per assignment)"
        if model.pooled_b <= 0
        else f"the timing window does not pin the slope of time against assignments down (relative standard error "
        f"{model.slope_error:.0%}: its ranks computed too similar loads)"
    )
    details = {
        "step_ms": timing.step_ms,
        "gap_ms": timing.gap_ms,
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
    return _insufficient(
        reasons,
        f"{why}: the gain lies between none and {ratio - 1:+.1%}; time a window where the ranks' loads differ "
        "(the linear layout under the scene's load)",
        **details,
    )


def _running(counts: Counts, running: Layout | None, candidate: Layout, rows: list[int], shares) -> Setup:
    """The running server's layout, from the dump's metadata (its layout hash, dispatch) and ``running``."""
    meta, E, ep = counts.meta, candidate.geometry.num_experts, candidate.geometry.ep_size
    dispatch = meta.get("dispatch") or "dynamic"
    if meta.get("layout_hash") is None:
        if running is not None:
            raise SceneEplbError("the dump was recorded on the linear layout (no layout_hash), but a running layout was given")
        return Setup.of(None, Geometry(E, (-E) % ep, ep), dispatch, rows, shares)
    if running is None:
        raise SceneEplbError(f"the dump was recorded under layout {meta['layout_hash']}: give that layout (--running)")
    if running.digest() != meta["layout_hash"]:
        raise SceneEplbError(f"the running layout is {running.digest()}, the dump was recorded under {meta['layout_hash']}")
    return Setup.of(running, running.geometry, dispatch, rows, shares)


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
    if counts.num_experts != candidate.geometry.num_experts or counts.num_layers != candidate.num_layers:
        raise SceneEplbError(
            f"the candidate is for {candidate.geometry.num_experts} experts and {candidate.num_layers} layers, "
            f"the counts have {counts.num_experts} and {counts.num_layers}"
        )
    rows = list(candidate.moe_layers)
    if not isinstance(timing, TimingWindow):
        return _insufficient(
            reasons,
            "no timing window with traffic: start the running server with scene_eplb.time_moe true, record the scene "
            "(the stop's status carries the record's own window) and give that status (--url or --timing)",
        )
    if timing.layers != len(rows):
        raise SceneEplbError(f"the timing has {timing.layers} MoE layers, the candidate {len(rows)}")
    if timing.ranks != candidate.geometry.ep_size:
        raise SceneEplbError(f"the timing has {timing.ranks} ranks, the candidate is for ep_size {candidate.geometry.ep_size}")
    if counts.physical is None:
        return _insufficient(
            reasons, "the dump carries no measured replica traffic (physical_count): record it with this plugin version"
        )
    mismatch = provenance_mismatch(counts.meta, timing)
    if mismatch:
        return _insufficient(
            reasons, "the timing window is not from the server and setup the dump was recorded on: " + "; ".join(mismatch)
        )
    shares = source_shares(counts, rows, candidate.geometry.ep_size)
    now = _running(counts, running, candidate, rows, shares)
    if counts.physical.shape[2] != now.geometry.num_physical:
        raise SceneEplbError(
            f"the dump's physical_count has {counts.physical.shape[2]} slots, its running layout {now.geometry.num_physical}"
        )
    cand = Setup.of(candidate, candidate.geometry, dispatch, rows, shares)
    passes, origin = recorded_passes(counts, rows, seed)
    n_entries = counts.written_entries().size
    if passes.shape[0] < MIN_PASSES or n_entries < 2:
        return _insufficient(
            reasons,
            f"the dump holds {passes.shape[0]} passes in {n_entries} written entries: at least {MIN_PASSES} passes in "
            "2 entries are needed for a per-pass distribution and the halves of the recording",
        )
    model = fit_time_model(np.asarray(timing.rank_ms), np.asarray(timing.rank_assignments))
    step = timing.step_ms
    if not model.identified:
        return _unidentified(reasons, model, timing, now.rank_loads(passes), cand.rank_loads(passes), ab_ratio)
    crit_now_pass, crit_cand_pass = model.critical(now.rank_loads(passes)), model.critical(cand.rank_loads(passes))
    c_now, c_cand = float(crit_now_pass.mean()), float(crit_cand_pass.mean())
    floor, floor_source = noise_floor(timing, model, c_now, ab_ratio)
    # the running layout's model against measurement, on the recording's mean pass
    logical_total = counts.data[counts.written_entries()][:, rows].sum(axis=0)
    modelled_slots = np.einsum("le,lep->lp", logical_total.astype(np.float64), now.operator)
    physical_total = counts.physical[counts.written_entries()][:, rows].sum(axis=0)
    fid = fidelity(physical_total, modelled_slots, now.p2l, now.geometry.num_experts)
    mean_pass = passes.shape[0]
    g = now.geometry
    c_mod_mean = float(model.critical(modelled_slots.reshape(len(rows), g.ep_size, -1).sum(axis=2) / mean_pass))
    c_meas_mean = float(
        model.critical(physical_total.reshape(len(rows), g.ep_size, -1).sum(axis=2).astype(np.float64) / mean_pass)
    )
    c_window = float(np.asarray(timing.rank_ms).max(axis=0).sum())
    # the same check on the timing window's own passes: its measured load per layer spread over the
    # ranks by the running layout's modelled shares (the window and the dump may differ in batch size)
    modelled_ranks = modelled_slots.reshape(len(rows), g.ep_size, -1).sum(axis=2)
    rank_share = modelled_ranks / np.maximum(modelled_ranks.sum(axis=1, keepdims=True), 1e-300)
    window_load = np.asarray(timing.rank_assignments, dtype=np.float64).sum(axis=0)  # [layers]
    c_mod_window = float(model.critical(rank_share * window_load[:, None]))
    numbers = {
        "critical_ms_now": c_now,
        "critical_ms_candidate": c_cand,
        "step_ms": step,
        "gap_ms": timing.gap_ms,
        "moe_share": timing.moe_share,
        "noise_floor": floor,
        "noise_floor_source": floor_source,
        "model_residual": model.residual,
        "model": {"a": model.a.tolist(), "b": model.b.tolist()},
        "passes": int(passes.shape[0]),
        "fidelity_now": fid,
        "mean_pass_ms_modelled": c_mod_mean,
        "mean_pass_ms_measured": c_meas_mean,
        "timing_window_slowest_ms": c_window,
        "timing_window_slowest_ms_modelled": c_mod_window,
    }
    reasons.append(
        f"count -> time model: per layer ms = a + b x assignments on a rank, fitted on {timing.ranks} ranks x "
        f"{len(rows)} layers of the timing window ({WINDOW_KINDS[timing.record]}; relative residual {model.residual:.1%}); "
        f"{passes.shape[0]} passes from {n_entries} entries"
    )
    if c_now > step:
        return _insufficient(
            reasons,
            f"the modelled MoE critical path now ({c_now:.2f} ms per pass) is longer than the whole step ({step:.2f} ms): "
            "the timing window and the dump do not describe the same passes"
            + (
                ""
                if timing.record
                else " (give the status the record's stop answered: its record_time is the record's own window)"
            ),
            **numbers,
        )
    for where, what, modelled, measured in (
        ("the dump's mean pass", "its measured replica traffic", c_mod_mean, c_meas_mean),
        ("the timing window's mean pass (its load, the modelled rank shares)", "the window measured", c_mod_window, c_window),
    ):
        if abs(modelled - measured) / step > floor:
            return _insufficient(
                reasons,
                f"the running layout modelled from the logical counts gives {modelled:.3f} ms on the slowest ranks of "
                f"{where}, {what} {measured:.3f} ms: {abs(modelled - measured) / step:.1%} of the step, above the noise "
                f"floor of {floor:.1%} (fidelity {'n/a' if fid is None else f'{fid:.3f}'}): the model does not describe this server",
                **numbers,
            )
    cycle = cycle_ms(timing)
    ratio = throughput_ratio(cycle, c_now, c_cand)
    first = origin < (n_entries + 1) // 2
    halves = [
        throughput_ratio(cycle, float(crit_now_pass[part].mean()), float(crit_cand_pass[part].mean())) for part in (first, ~first)
    ]
    reasons.append(
        f"MoE critical path {c_now:.2f} ms per pass now, {c_cand:.2f} ms with the candidate (expected slowest rank per "
        f"pass, one model for both), in a {step:.2f} ms step and {timing.gap_ms:.2f} ms between steps: predicted "
        f"throughput ratio {ratio:.3f}"
    )
    if timing.moe_share is not None:
        reasons.append(f"MoE is {timing.moe_share:.1%} of step time here: no layout can save more than that share")
    reasons.append(
        f"stability: predicted ratio {halves[0]:.3f} on the first half of the recording, {halves[1]:.3f} on the second"
    )
    if ratio - 1 < floor:
        verdict = "skip"
        reasons.append(
            f"predicted gain {ratio - 1:+.1%} is within the noise floor of {floor:.1%} ({floor_source}): not worth a restart"
        )
    elif min(halves) - 1 < floor:
        verdict = "skip"
        reasons.append(
            f"the gain does not hold on both halves of the recording (floor {floor:.1%}): the scene is not stable enough"
        )
    else:
        verdict = "trial"
        reasons.append(
            f"predicted gain {ratio - 1:+.1%} clears the noise floor of {floor:.1%} ({floor_source}) on the whole recording "
            "and both halves: try it, and measure with an A/B on the same load"
        )
    return Advice(verdict, ratio, tuple(reasons), {**numbers, "halves": halves})
