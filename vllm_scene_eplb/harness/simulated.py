"""A simulated server for calibrating ``advise``: per-pass routing sampled from each layer's
distribution, a linear device, a dump at any ``steps_per_entry`` and the true ratio pass by pass.

The truth: every pass draws ``tokens x top_k`` assignments per MoE layer from that layer's expert
distribution (multinomial; a token's k experts are not forced distinct); the running server is on
the linear layout (measured replica traffic = its logical counts); a rank's MoE time per layer and
pass is ``a + b x assignments`` and every layer waits for its slowest rank; the step is the MoE
critical path plus ``other_ms``. The true throughput ratio of a candidate is the mean step now over
the mean step with the candidate, both over fresh passes (not the recorded ones), each pass's loads
through the same dispatch operator ``advise`` uses (sources split evenly, as over TP rows). Pure
numpy, no engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import __version__
from ..advise import Setup
from ..counts import Counts
from ..layout import Geometry, Layout
from ..protocol import TimingWindow

SUB_WINDOWS = 8  # how many sub-windows the simulated timing window reports


@dataclass(frozen=True)
class Device:
    """Rank MoE time per layer and pass ``a_ms + b_ms x assignments``; ``other_ms`` per step outside MoE."""

    a_ms: float
    b_ms: float
    other_ms: float


@dataclass(frozen=True)
class Scene:
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


def critical_ms(device: Device, loads: np.ndarray) -> np.ndarray:
    """The MoE critical path of every pass for rank loads [n, L, ranks]: [n]."""
    return (device.a_ms + device.b_ms * loads).max(axis=2).sum(axis=1)


def provenance(scene: Scene, ep_size: int, steps_per_entry: int) -> dict:
    """What the simulated server says about itself, in the dump and in the timing window alike."""
    return {
        "layout_hash": None,
        "ep_size": ep_size,
        "redundant_slots": 0,
        "role": scene.role,
        "dispatch": None,
        "steps_per_entry": steps_per_entry,
        "engine": "simulated",
        "plugin_version": __version__,
    }


def dump(scene: Scene, passes: np.ndarray, ep_size: int, steps_per_entry: int) -> Counts:
    """The recording of ``passes`` [n, L, E] as the recorder dumps it: every ``steps_per_entry``
    consecutive passes summed into one entry, the measured replica traffic of the linear layout."""
    n, L, E = passes.shape
    entries = -(-n // steps_per_entry)
    data = np.zeros((entries, L, E), dtype=np.int64)
    np.add.at(data, np.arange(n) // steps_per_entry, passes)
    physical = np.concatenate([data, np.zeros((entries, L, (-E) % ep_size), dtype=np.int64)], axis=2)
    meta = {
        **provenance(scene, ep_size, steps_per_entry),
        "moe_layers": list(range(L)),
        "top_k": scene.top_k,
        "passes_per_rank": [n] * ep_size,
        "scheduled_tokens": n * scene.tokens_per_pass,
    }
    return Counts(data, meta, physical=physical)


def timing_window(scene: Scene, device: Device, passes: np.ndarray, ep_size: int, steps_per_entry: int) -> TimingWindow:
    """The running server's timing window over ``passes``: per-rank mean ms and assignments per
    pass, the mean step, and the steps of ``SUB_WINDOWS`` consecutive sub-windows."""
    now = linear_setup(scene.p.shape[1], ep_size, len(scene.p))
    loads = now.rank_loads(passes)  # [n, L, ranks]
    ms = device.a_ms + device.b_ms * loads
    steps = device.other_ms + ms.max(axis=2).sum(axis=1)
    subs = [float(part.mean()) for part in np.array_split(steps, SUB_WINDOWS) if part.size]
    return TimingWindow(
        tuple(tuple(float(x) for x in row) for row in ms.mean(axis=0).T),
        tuple(tuple(float(x) for x in row) for row in loads.mean(axis=0).T),
        float(steps.mean()),
        float(ms.mean(axis=2).sum(axis=1).mean() / steps.mean()),
        tuple(subs),
        provenance(scene, ep_size, steps_per_entry),
    )


def true_ratio(device: Device, passes: np.ndarray, candidate: Layout, dispatch: str) -> float:
    """The candidate's throughput over the linear layout's, pass by pass on ``passes`` [n, L, E]."""
    rows = list(range(passes.shape[1]))
    now = linear_setup(passes.shape[2], candidate.geometry.ep_size, passes.shape[1])
    cand = Setup.of(candidate, candidate.geometry, dispatch, rows, None)
    step_now = device.other_ms + critical_ms(device, now.rank_loads(passes)).mean()
    step_cand = device.other_ms + critical_ms(device, cand.rank_loads(passes)).mean()
    return float(step_now / step_cand)
