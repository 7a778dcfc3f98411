"""``advise`` against the real CPU expert kernel: its prediction of a fitted layout's throughput
ratio over the linear one, from a kernel-timed window, against the ratio the kernel then gives.

Each cell is a scene (a Zipf router skew, each MoE layer its own permutation of the experts) at a
number of tokens a pass, in a ``Regime`` (``--regime``: ``prefill``, hundreds of tokens a pass on
256 experts, issue 37's; ``decode``, a few tokens a pass on 64 1024-wide experts, issue 47's).
Every pass routes each token to ``top_k`` distinct experts and runs, per
MoE layer and EP rank, the plugin's CPU expert op (``adapters/vllm/cpu_moe.local_apply``: the rows
routed to that rank's slots, its own weights per layer and rank) on plain torch tensors, one thread,
timed by the wall clock: the pass's MoE time is the sum over layers of its slowest rank, and a step
adds outside MoE as much again (``MOE_SHARE``). The running server is the linear layout; its
recorded passes give the dump (one pass an entry, with the measured slot traffic) and the timing
window (each rank's mean ms, assignments and active slots per pass: what the record's own window
carries, the active slots included). The candidate is fitted on the dump (``static`` dispatch,
the regime's redundant slots). The truth: fresh passes, each run under both layouts in turn (a
token's source rank its row's half of the batch, its slot the static table's), the mean step of
the linear one over the candidate's. ``advise`` is run with the window's active slots (c priced or
bounded) and without them (c unpriced, the model before issue 37); the table prints both errors,
and under each cell the MoE critical path of both layouts: advise's per-pass price, the kernel's
per pass, and the kernel's slowest rank means summed (what a window of rank means shows).

    python benchmarks/bench_advise_kernel.py [--regime prefill|decode] [--quick] [--passes N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
import torch
from vllm._custom_ops import cpu_prepack_moe_weight

from vllm_scene_eplb import __version__
from vllm_scene_eplb.adapters.vllm.cpu_moe import local_apply
from vllm_scene_eplb.advise import advise
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.dispatch import static_table
from vllm_scene_eplb.layouts.layout import Geometry, Layout
from vllm_scene_eplb.protocol import TimingWindow

EP, L = 2, 4
REPEATS = 3  # each rank's op is timed this many times a pass, the least kept (a preempted run is not the kernel's)
MOE_SHARE = 0.5  # the MoE part of a step: outside MoE the step takes as long again
SEED = 20261202
TARGET = 0.01  # |advise - truth| in ratio, issue 37


@dataclass(frozen=True)
class Regime:
    """The experts' shape, the candidate's redundant slots and the grid of skews x tokens a pass."""

    experts: int
    top_k: int
    hidden: int
    intermediate: int
    redundant: int
    tokens: tuple[int, ...]
    skews: tuple[float, ...]


REGIMES = {
    # prefill-sized passes (issue 37): many experts, hundreds of tokens a pass
    "prefill": Regime(256, 8, 128, 128, 16, (256, 512, 1024), (0.3, 0.6, 1.0)),
    # decode-sized passes (issue 47): the engine check's model (64 experts, top-4, hidden 256, 1024 wide,
    # 2 redundant slots) at a few tokens a pass, where a pass reads the weights of a part of the experts
    "decode": Regime(64, 4, 256, 1024, 2, (4, 8, 16, 32), (0.5, 1.0)),
}


def scene(g: Regime, skew: float, rng: np.random.Generator) -> np.ndarray:
    """Each layer's expert distribution [L, E]: Zipf(``skew``) over a random order of the experts."""
    p = np.arange(1, g.experts + 1, dtype=np.float64) ** -skew
    return np.stack([(p / p.sum())[rng.permutation(g.experts)] for _ in range(L)])


def route(g: Regime, p: np.ndarray, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """One pass: each token's ``top_k`` distinct experts per layer, int [L, tokens, top_k] (Gumbel top-k)."""
    keys = np.log(p)[:, None, :] + rng.gumbel(size=(L, tokens, g.experts))
    return np.argsort(-keys, axis=2)[:, :, : g.top_k]


class Rig:
    """Every rank's expert weights per layer, for ``slots`` slots a rank, and the timed op: one set of
    weights for both layouts (the linear one leaves the last ``redundant / EP`` slots of a rank idle),
    so neither is timed on weights that sit better in memory."""

    def __init__(self, g: Regime, seed: int):
        torch.manual_seed(seed)
        self.g, self.slots = g, (g.experts + g.redundant) // EP
        self.w13 = [[self._weight(2 * g.intermediate, g.hidden) for _ in range(EP)] for _ in range(L)]
        self.w2 = [[self._weight(g.hidden, g.intermediate) for _ in range(EP)] for _ in range(L)]
        slots = self.slots
        self.maps = [
            torch.tensor(
                [s - r * slots if r * slots <= s < (r + 1) * slots else -1 for s in range(EP * slots)], dtype=torch.int32
            )
            for r in range(EP)
        ]
        self.experts = SimpleNamespace(w1_bias=None, w2_bias=None, isa="vec")

    def _weight(self, rows: int, cols: int) -> torch.Tensor:
        return cpu_prepack_moe_weight(torch.randn(self.slots, rows, cols, dtype=torch.bfloat16) * 0.02, "vec")

    def inputs(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A pass's hidden states [tokens, hidden] and router weights [tokens, top_k]."""
        return torch.randn(tokens, self.g.hidden, dtype=torch.bfloat16), torch.rand(tokens, self.g.top_k)

    def pass_ms(self, slot_ids: np.ndarray, x: torch.Tensor, weights: torch.Tensor) -> np.ndarray:
        """Every rank's kernel ms per layer [L, EP] of one pass routed to physical slots [L, tokens, top_k]."""
        out = torch.empty_like(x)
        ms = np.empty((L, EP))
        for layer in range(L):
            ids = torch.from_numpy(slot_ids[layer].astype(np.int32))
            for r in range(EP):
                ms[layer, r] = min(self._timed(out, x, weights, ids, layer, r) for _ in range(REPEATS))
        return ms

    def _timed(self, out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, layer: int, r: int) -> float:
        """Rank ``r``'s op on layer ``layer``'s weights, in ms."""
        start = time.perf_counter()
        local_apply(
            self.experts, out, x, self.w13[layer][r], self.w2[layer][r], weights, ids, SimpleNamespace(value="silu"),
            self.maps[r], False,
        )  # fmt: skip
        return 1000 * (time.perf_counter() - start)


def linear_slots(g: Regime, experts: np.ndarray, slots: int) -> np.ndarray:
    """The linear layout's slots [L, tokens, top_k] in a rig of ``slots`` a rank: expert e on rank e // (E / EP)."""
    per_rank = g.experts // EP
    return experts // per_rank * slots + experts % per_rank


def slot_loads(slot_ids: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Assignments and active slots per layer and rank [L, EP] of one pass's physical slots [L, tokens, top_k]."""
    per_slot = np.stack([np.bincount(s.ravel(), minlength=EP * slots) for s in slot_ids]).reshape(L, EP, slots)
    return per_slot.sum(axis=2).astype(np.float64), (per_slot > 0).sum(axis=2).astype(np.float64)


def candidate_slots(layout: Layout, experts: np.ndarray) -> np.ndarray:
    """Physical slots [L, tokens, top_k] of a pass under ``static`` dispatch: row i of T from source rank i * EP // T."""
    table = static_table(layout.physical_to_logical_map, layout.geometry, layout.static_sources)  # [L, EP, E]
    source = np.arange(experts.shape[1]) * EP // experts.shape[1]
    return table[np.arange(L)[:, None, None], source[None, :, None], experts]


def kernel_costs(rig: Rig, rng: np.random.Generator) -> tuple[float, float, float]:
    """The op's own a (ms), b (ms per assignment) and c (ms per active slot) on one rank and layer,
    fitted over a grid of tokens and active slots (each token's experts among the first k slots)."""
    g, points, ms = rig.g, [], []
    for tokens in sorted({min(g.tokens), 64, 128, 256}):
        for k in sorted({min(16, rig.slots), min(64, rig.slots), rig.slots}):
            ids = np.stack([rng.permutation(k)[: g.top_k] for _ in range(tokens)])[None].repeat(L, axis=0)
            x, w = rig.inputs(tokens)
            points.append((1.0, tokens * g.top_k, len(np.unique(ids[0]))))
            ms.append(float(np.median([rig.pass_ms(ids, x, w)[0, 0] for _ in range(3)])))
    (a, b, c), *_ = np.linalg.lstsq(np.array(points), np.array(ms), rcond=None)
    return float(a), float(b), float(c)


def record(rig: Rig, p: np.ndarray, tokens: int, passes: int, rng: np.random.Generator) -> tuple[Counts, TimingWindow]:
    """The linear server's dump and timing window over ``passes`` passes."""
    g, counts, ms, loads, active = rig.g, [], [], [], []
    for _ in range(passes):
        experts = route(g, p, tokens, rng)
        ms.append(rig.pass_ms(linear_slots(g, experts, rig.slots), *rig.inputs(tokens)))
        n, k = slot_loads(experts, g.experts // EP)
        loads.append(n)
        active.append(k)
        counts.append(np.stack([np.bincount(e.ravel(), minlength=g.experts) for e in experts]))
    ms_a, n_a, k_a = np.array(ms), np.array(loads), np.array(active)
    critical = ms_a.max(axis=2).sum(axis=1)
    other = float(critical.mean()) * (1 / MOE_SHARE - 1)
    steps = other + critical
    provenance = {
        "layout_hash": None,
        "ep_size": EP,
        "redundant_slots": 0,
        "role": "decode",
        "dispatch": None,
        "steps_per_entry": 1,
        "engine": "cpu kernel bench",
        "plugin_version": __version__,
    }
    data = np.array(counts, dtype=np.int64)
    meta = {**provenance, "moe_layers": list(range(L)), "top_k": g.top_k, "passes_per_rank": [passes] * EP}
    window = TimingWindow(
        tuple(map(tuple, ms_a.mean(axis=0).T.tolist())),
        tuple(map(tuple, n_a.mean(axis=0).T.tolist())),
        float(steps.mean()),
        provenance,
        float(ms_a.sum(axis=1).mean() / steps.mean()),
        tuple(float(s.mean()) for s in np.array_split(steps, 8)),
        record=True,
        rank_active_slots=tuple(map(tuple, k_a.mean(axis=0).T.tolist())),
    )
    return Counts(data, {**meta, "scheduled_tokens": passes * tokens}, physical=data.copy()), window


@dataclass(frozen=True)
class Truth:
    """The kernel on fresh passes, each run under both layouts in turn: the throughput ratio of the
    candidate over the linear one, the gap between its two halves' ratios (the truth's own noise),
    and per side the MoE critical path per pass (the mean over passes of each layer's slowest rank,
    summed: what a step waits for) and the slowest rank of the mean pass (each layer's largest rank
    mean, summed: what a window of rank means shows), both ms."""

    ratio: float
    halves_gap: float
    per_pass: tuple[float, float]
    of_means: tuple[float, float]


def truth(rig: Rig, layout: Layout, p: np.ndarray, tokens: int, passes: int, other: float, rng) -> Truth:
    """``Truth`` of ``layout`` against the linear one over ``passes`` fresh passes."""
    g, sides = rig.g, ([], [])
    for i in range(passes):
        experts = route(g, p, tokens, rng)
        x, w = rig.inputs(tokens)
        slots = (linear_slots(g, experts, rig.slots), candidate_slots(layout, experts))
        for side in (0, 1)[:: 1 - 2 * (i % 2)]:  # the two in turn, each first every other pass
            sides[side].append(rig.pass_ms(slots[side], x, w))
    now, cand = (np.array(s) for s in sides)  # [passes, L, EP]
    crit_now, crit_cand = (s.max(axis=2).sum(axis=1) for s in (now, cand))
    halves = [(other + crit_now[h].mean()) / (other + crit_cand[h].mean()) for h in np.array_split(np.arange(passes), 2)]
    return Truth(
        float((other + crit_now.mean()) / (other + crit_cand.mean())),
        float(abs(halves[0] - halves[1])),
        (float(crit_now.mean()), float(crit_cand.mean())),
        tuple(float(s.mean(axis=0).max(axis=1).sum()) for s in (now, cand)),
    )


def cell(skew: float, tokens: int, passes: int, rig: Rig, rng: np.random.Generator) -> dict:
    """One scene at ``tokens`` a pass: advise with and without active slots, and the truth."""
    g = rig.g
    p = scene(g, skew, rng)
    counts, window = record(rig, p, tokens, passes, rng)
    layout = fit(
        Counts(counts.total()[None], {"moe_layers": list(range(L))}),
        FitOptions(Geometry(g.experts, g.redundant, EP), dispatch="static"),
    )
    other = window.step_ms - float(np.asarray(window.rank_ms).max(axis=0).sum())
    true = truth(rig, layout, p, tokens, passes, other, rng)
    priced = advise(counts, layout, "static", window)
    unpriced = advise(counts, layout, "static", replace(window, rank_active_slots=None))
    d = priced.details
    at_zero = (
        None
        if "critical_ms_now" not in d
        else window.step_ms / (window.step_ms - d["critical_ms_now"] + d["critical_ms_candidate"])
    )
    return {
        "skew": skew,
        "tokens": tokens,
        "truth": true.ratio,
        "truth_halves_gap": true.halves_gap,
        "advise": priced.predicted_throughput_ratio,
        "verdict": priced.verdict,
        "ends": None if "bound_ratio" not in d or at_zero is None else sorted((at_zero, d["bound_ratio"])),
        "c_ms": d.get("model", {}).get("c"),
        "slots": d.get("model", {}).get("slots"),
        "unpriced": unpriced.predicted_throughput_ratio,
        "unpriced_verdict": unpriced.verdict,
        # the MoE critical path, ms: advise's price per pass, the kernel's per pass, the kernel's slowest rank mean
        "critical_advise": [d.get("critical_ms_now"), d.get("critical_ms_candidate")],
        "critical_per_pass": list(true.per_pass),
        "critical_of_means": list(true.of_means),
    }


def _line(row: dict) -> str:
    """One cell's row of the table."""
    adv = "n/a" if row["advise"] is None else f"{row['advise']:.3f}"
    c = "n/a" if row["c_ms"] is None else f"{row['c_ms']:.4f} ms" if row["slots"] == "priced" else "unidentified"
    ends = "" if row["ends"] is None else f"{row['ends'][0]:.3f}..{row['ends'][1]:.3f}"
    if row["ends"] is not None:
        ends += " holds" if row["ends"][0] <= row["truth"] <= row["ends"][1] else " misses"
    plain = "n/a" if row["unpriced"] is None else f"{row['unpriced']:.3f}"
    return (
        f"{row['skew']:5.1f} {row['tokens']:6d} {row['truth']:6.3f} {row['truth_halves_gap']:6.3f} {adv:>7} {_err(row['advise'], row['truth']):>7} "
        f"{row['verdict']:>21} {c:>12} {ends:>21} {plain:>8} {_err(row['unpriced'], row['truth']):>7}"
    )


def _critical_line(row: dict) -> str:
    """The cell's MoE critical paths, running and candidate: advise's per-pass price against the
    kernel's per pass, and the kernel's slowest rank mean (what a window of rank means reads)."""
    out = []
    for i, side in enumerate(("running", "candidate")):
        price, per_pass, of_means = row["critical_advise"][i], row["critical_per_pass"][i], row["critical_of_means"][i]
        priced = "n/a" if price is None else f"{price:.3f} ({price / per_pass - 1:+.1%})"
        out.append(f"{side} {priced} / {per_pass:.3f} / {of_means:.3f} ({per_pass / of_means - 1:+.1%})")
    return "      critical ms, advise / kernel per pass / slowest rank mean: " + "; ".join(out)


def _err(x: float | None, truth: float) -> str:
    return "   n/a" if x is None else f"{x - truth:+.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regime", choices=sorted(REGIMES), default="prefill", help="the passes' size and the experts' shape")
    ap.add_argument("--quick", action="store_true", help="one cell (skew 1, the regime's second pass size)")
    ap.add_argument("--passes", type=int, default=28, help="recorded passes and fresh truth passes per cell (default 28)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if args.passes < 16:
        ap.error("--passes must be at least 16 (advise needs 16 recorded passes)")
    torch.set_num_threads(1)
    g = REGIMES[args.regime]
    rng = np.random.default_rng(SEED)
    rig = Rig(g, SEED)
    grid = [(1.0, g.tokens[1])] if args.quick else [(s, t) for s in g.skews for t in g.tokens]
    a, b, c = kernel_costs(rig, rng)
    print(f"the kernel alone (one rank, one layer): {a:.3f} ms + {1000 * b:.2f} us x assignments + {c:.4f} ms x active slots")
    print(
        f"{args.regime}: E={g.experts} EP={EP} layers={L} top-k={g.top_k} hidden={g.hidden} intermediate={g.intermediate} "
        f"R={g.redundant} static, MoE {MOE_SHARE:.0%} of the step"
    )
    print(
        f"{'skew':>5} {'tokens':>6} {'truth':>6} {'halves':>6} {'advise':>7} {'err':>7} {'verdict':>21} {'c':>12} {'c in [0, max]: ratio':>21} "
        f"{'unpriced':>8} {'err':>7}"
    )
    rows = []
    for skew, tokens in grid:
        row = cell(skew, tokens, args.passes, rig, rng)
        rows.append(row)
        print(_line(row))
        print(_critical_line(row), flush=True)
    priced = [abs(r["advise"] - r["truth"]) for r in rows if r["advise"] is not None]
    unpriced = [abs(r["unpriced"] - r["truth"]) for r in rows if r["unpriced"] is not None]
    print(
        f"|advise - truth|: max {max(priced, default=float('nan')):.3f} over {len(priced)} priced cells "
        f"({len(rows) - len(priced)} abstained), target <= {TARGET}; c unpriced: max {max(unpriced, default=float('nan')):.3f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
