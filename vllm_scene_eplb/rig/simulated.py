"""A simulated server for calibrating ``advise``: per-pass routing sampled from each layer's
distribution, a linear device, a dump at any ``steps_per_entry`` and the true ratio pass by pass.

The truth: every pass draws ``tokens x top_k`` assignments per MoE layer from that layer's expert
distribution (multinomial; a token's k experts are not forced distinct); the running server runs
the linear layout or a given one, its measured replica traffic its dispatch's split of the logical
counts (rounded to whole assignments); a rank's MoE time per layer and pass is ``a + b x assignments
+ c x active slots`` (each slot active by the chance ``Setup.slot_active`` gives it, drawn per pass)
and every layer waits for its slowest rank; the step is the MoE critical path plus ``other_ms``. The true throughput ratio of a candidate is the mean step now over
the mean step with the candidate, both over fresh passes (not the recorded ones), each pass's loads
through the same dispatch operator ``advise`` uses (sources split evenly, as over TP rows). Pure
numpy, no engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import __version__
from ..advise import Setup
from ..layouts.counts import Counts
from ..layouts.layout import Geometry, Layout
from ..protocol import TimingWindow

SUB_WINDOWS = 8  # how many sub-windows the simulated timing window reports
CHUNK = 256  # passes sampled at once for the truth


@dataclass(frozen=True)
class Device:
    """Rank MoE time per layer and pass ``a_ms + b_ms x assignments + c_ms x active slots``; ``other_ms``
    per step outside MoE."""

    a_ms: float
    b_ms: float
    other_ms: float
    c_ms: float = 0.0


@dataclass(frozen=True)
class SimulatedTraffic:
    """What is served: each MoE layer's expert distribution ``p`` [L, E], tokens per pass, top-k, role."""

    p: np.ndarray
    tokens_per_pass: int
    top_k: int
    role: str

    def passes(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` passes of routing: int [n, L, E]."""
        return rng.multinomial(self.tokens_per_pass * self.top_k, self.p, size=(n, len(self.p)))


def linear_setup(num_experts: int, ep_size: int, layers: int) -> Setup:
    """The running server's linear layout (no layout loaded)."""
    return Setup.of(None, Geometry(num_experts, (-num_experts) % ep_size, ep_size), "dynamic", list(range(layers)), None)


def rank_ms(device: Device, setup: Setup, passes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Every rank's MoE ms of every pass [n, L, ranks] of logical counts [n, L, E] under ``setup``,
    its active slots drawn (none when the device has no cost per active slot)."""
    ms = device.a_ms + device.b_ms * setup.rank_loads(passes)
    return ms if device.c_ms == 0 else ms + device.c_ms * active_slots(setup, passes, rng)


def active_slots(setup: Setup, passes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Every pass's active slots per rank [n, L, ranks]: each slot active by its chance (``Setup.slot_active``)."""
    chance = setup.slot_active(passes)
    return setup.per_rank((rng.random(chance.shape) < chance).astype(np.float64))


def _integer_split(total: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Integer slot counts [T, L, P] of ``total`` [T, L, E] split by ``shares`` [L, E, P] (largest
    remainder per expert over its few slots, so every expert's assignments stay whole)."""
    L, E, P = shares.shape
    width = max(int((shares > 0).sum(axis=2).max()), 1)
    slots = np.argsort(-shares, axis=2, kind="stable")[:, :, :width]  # [L, E, c]: an expert's slots first
    part = np.take_along_axis(shares, slots, axis=2)
    exact = total[..., None].astype(np.float64) * part  # [T, L, E, c]
    low = np.floor(exact + 1e-9)
    short = np.rint(total - low.sum(axis=-1)).astype(np.int64)
    order = np.argsort(np.argsort(-(exact - low), axis=-1, kind="stable"), axis=-1)
    whole = (low + (order < short[..., None])).astype(np.int64)
    out = np.zeros((total.shape[0], L * P), dtype=np.int64)
    flat = (np.arange(L)[:, None, None] * P + slots).ravel()
    for t in range(total.shape[0]):
        np.add.at(out[t], flat, whole[t].ravel())
    return out.reshape(total.shape[0], L, P)


@dataclass(frozen=True)
class Server:
    """The simulated server: what it serves, its device, its EP size and the layout it runs
    (``running`` None: the linear layout) under ``dispatch``; its timing window's measurements carry
    ``noise`` (seeded): every rank's ms per layer and every sub-window's step times 1 + N(0, noise);
    with ``capture_active`` the window also carries every rank's mean active slots per pass."""

    scene: SimulatedTraffic
    device: Device
    ep_size: int
    running: Layout | None = None
    dispatch: str = "dynamic"
    noise: float = 0.0  # relative sd of the timing window's measurement noise (rank ms, sub-window steps)
    seed: int = 0
    capture_active: bool = False

    @property
    def setup(self) -> Setup:
        L, E = self.scene.p.shape
        if self.running is None:
            return linear_setup(E, self.ep_size, L)
        return Setup.of(self.running, self.running.geometry, self.dispatch, list(range(L)), None)

    def provenance(self, steps_per_entry: int) -> dict:
        """What the server says about itself, in the dump and in the timing window alike."""
        return {
            "layout_hash": None if self.running is None else self.running.digest(),
            "ep_size": self.ep_size,
            "redundant_slots": 0 if self.running is None else self.running.geometry.num_redundant,
            "role": self.scene.role,
            "dispatch": None if self.running is None else self.dispatch,
            "steps_per_entry": steps_per_entry,
            "engine": "simulated",
            "plugin_version": __version__,
        }

    def dump(self, passes: np.ndarray, steps_per_entry: int) -> Counts:
        """The recording of ``passes`` [n, L, E] as the recorder dumps it: every ``steps_per_entry``
        consecutive passes summed into one entry, with the running layout's replica traffic."""
        n, L, E = passes.shape
        entries = -(-n // steps_per_entry)
        data = np.zeros((entries, L, E), dtype=np.int64)
        np.add.at(data, np.arange(n) // steps_per_entry, passes)
        meta = {
            **self.provenance(steps_per_entry),
            "moe_layers": list(range(L)),
            "top_k": self.scene.top_k,
            "passes_per_rank": [n] * self.ep_size,
            "scheduled_tokens": n * self.scene.tokens_per_pass,
        }
        return Counts(data, meta, physical=_integer_split(data, self.setup.operator))

    def timing_window(self, passes: np.ndarray, steps_per_entry: int) -> TimingWindow:
        """The timing window over ``passes``: per-rank mean ms and assignments per pass, the mean
        step, and the steps of ``SUB_WINDOWS`` consecutive sub-windows."""
        loads = self.setup.rank_loads(passes)  # [n, L, ranks]
        rng = np.random.default_rng(self.seed)
        active = active_slots(self.setup, passes, np.random.default_rng(self.seed + 1))
        ms = self.device.a_ms + self.device.b_ms * loads + self.device.c_ms * active
        steps = self.device.other_ms + ms.max(axis=2).sum(axis=1)
        subs = [float(part.mean()) * (1 + self.noise * rng.standard_normal()) for part in np.array_split(steps, SUB_WINDOWS)]
        measured = ms.mean(axis=0) * np.maximum(1 + self.noise * rng.standard_normal(ms.shape[1:]), 0.0)
        rank_moe = float(measured.sum(axis=0).max())
        return TimingWindow(
            tuple(tuple(float(x) for x in row) for row in measured.T),
            tuple(tuple(float(x) for x in row) for row in loads.mean(axis=0).T),
            max(float(steps.mean()), rank_moe),
            self.provenance(steps_per_entry),
            float(ms.mean(axis=2).sum(axis=1).mean() / steps.mean()),
            tuple(subs),
            rank_active_slots=tuple(tuple(float(x) for x in row) for row in active.mean(axis=0).T)
            if self.capture_active
            else None,
        )

    def true_ratio(self, candidate: Layout, dispatch: str, passes: int, rng: np.random.Generator) -> float:
        """The candidate's throughput over the running layout's, pass by pass on ``passes`` fresh
        passes (sampled in chunks of ``CHUNK``, so memory stays bounded)."""
        L = len(self.scene.p)
        now, cand = self.setup, Setup.of(candidate, candidate.geometry, dispatch, list(range(L)), None)
        c_now = c_cand = 0.0
        for size in [CHUNK] * (passes // CHUNK) + ([passes % CHUNK] if passes % CHUNK else []):
            batch = self.scene.passes(size, rng)
            c_now += float(rank_ms(self.device, now, batch, rng).max(axis=2).sum(axis=1).sum())
            c_cand += float(rank_ms(self.device, cand, batch, rng).max(axis=2).sum(axis=1).sum())
        other = self.device.other_ms
        return float((other + c_now / passes) / (other + c_cand / passes))
