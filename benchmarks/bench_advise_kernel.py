"""``advise`` against the real CPU expert kernel: its prediction of a fitted layout's throughput
ratio over the linear one, from a kernel-timed window, against the ratio the kernel then gives.

Each cell is a scene (a Zipf router skew, each MoE layer its own permutation of the experts) at a
number of tokens a pass. Every pass routes each token to ``TOP_K`` distinct experts and runs, per
MoE layer and EP rank, the plugin's CPU expert op (``adapters/vllm/cpu_moe.local_apply``: the rows
routed to that rank's slots, its own weights per layer and rank) on plain torch tensors, one thread,
timed by the wall clock: the pass's MoE time is the sum over layers of its slowest rank, and a step
adds outside MoE as much again (``MOE_SHARE``). The running server is the linear layout; its
recorded passes give the dump (one pass an entry, with the measured slot traffic) and the timing
window (each rank's mean ms, assignments and active slots per pass: what the record's own window
carries, the active slots included). The candidate is fitted on the dump (``static`` dispatch,
``REDUNDANT`` redundant slots). The truth: fresh passes, each run under both layouts in turn (a
token's source rank its row's half of the batch, its slot the static table's), the mean step of
the linear one over the candidate's. ``advise`` is run with the window's active slots (c priced or
bounded) and without them (c unpriced, the model before issue 37); the table prints both errors.

    python benchmarks/bench_advise_kernel.py [--quick] [--passes N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
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

E, EP, L, TOP_K, REDUNDANT = 256, 2, 4, 8, 16
REPEATS = 3  # each rank's op is timed this many times a pass, the least kept (a preempted run is not the kernel's)
HIDDEN = INTERMEDIATE = 128
MOE_SHARE = 0.5  # the MoE part of a step: outside MoE the step takes as long again
TOKENS, SKEWS = (256, 512, 1024), (0.3, 0.6, 1.0)
SEED = 20261202
TARGET = 0.01  # |advise - truth| in ratio, issue 37


def scene(skew: float, rng: np.random.Generator) -> np.ndarray:
    """Each layer's expert distribution [L, E]: Zipf(``skew``) over a random order of the experts."""
    p = np.arange(1, E + 1, dtype=np.float64) ** -skew
    return np.stack([(p / p.sum())[rng.permutation(E)] for _ in range(L)])


def route(p: np.ndarray, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """One pass: each token's ``TOP_K`` distinct experts per layer, int [L, tokens, TOP_K] (Gumbel top-k)."""
    keys = np.log(p)[:, None, :] + rng.gumbel(size=(L, tokens, E))
    return np.argsort(-keys, axis=2)[:, :, :TOP_K]


class Rig:
    """Every rank's expert weights per layer, for ``slots`` slots a rank, and the timed op: one set of
    weights for both layouts (the linear one leaves the last ``REDUNDANT / EP`` slots of a rank idle),
    so neither is timed on weights that sit better in memory."""

    def __init__(self, slots: int, seed: int):
        torch.manual_seed(seed)
        self.slots = slots
        self.w13 = [[self._weight(2 * INTERMEDIATE, HIDDEN) for _ in range(EP)] for _ in range(L)]
        self.w2 = [[self._weight(HIDDEN, INTERMEDIATE) for _ in range(EP)] for _ in range(L)]
        self.maps = [
            torch.tensor(
                [s - r * slots if r * slots <= s < (r + 1) * slots else -1 for s in range(EP * slots)], dtype=torch.int32
            )
            for r in range(EP)
        ]
        self.experts = SimpleNamespace(w1_bias=None, w2_bias=None, isa="vec")

    def _weight(self, rows: int, cols: int) -> torch.Tensor:
        return cpu_prepack_moe_weight(torch.randn(self.slots, rows, cols, dtype=torch.bfloat16) * 0.02, "vec")

    def pass_ms(self, slot_ids: np.ndarray, x: torch.Tensor, weights: torch.Tensor) -> np.ndarray:
        """Every rank's kernel ms per layer [L, EP] of one pass routed to physical slots [L, tokens, TOP_K]."""
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


def linear_slots(experts: np.ndarray, slots: int) -> np.ndarray:
    """The linear layout's slots [L, tokens, TOP_K] in a rig of ``slots`` a rank: expert e on rank e // (E / EP)."""
    per_rank = E // EP
    return experts // per_rank * slots + experts % per_rank


def slot_loads(slot_ids: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Assignments and active slots per layer and rank [L, EP] of one pass's physical slots [L, tokens, TOP_K]."""
    per_slot = np.stack([np.bincount(s.ravel(), minlength=EP * slots) for s in slot_ids]).reshape(L, EP, slots)
    return per_slot.sum(axis=2).astype(np.float64), (per_slot > 0).sum(axis=2).astype(np.float64)


def candidate_slots(layout: Layout, experts: np.ndarray) -> np.ndarray:
    """Physical slots [L, tokens, TOP_K] of a pass under ``static`` dispatch: row i of T from source rank i * EP // T."""
    table = static_table(layout.physical_to_logical_map, layout.geometry, layout.static_sources)  # [L, EP, E]
    source = np.arange(experts.shape[1]) * EP // experts.shape[1]
    return table[np.arange(L)[:, None, None], source[None, :, None], experts]


def kernel_costs(rig: Rig, rng: np.random.Generator) -> tuple[float, float, float]:
    """The op's own a (ms), b (ms per assignment) and c (ms per active slot) on one rank and layer,
    fitted over a grid of tokens and active slots (each token's experts among the first k slots)."""
    points, ms = [], []
    for tokens in (64, 128, 256):
        for k in (16, 64, rig.slots):
            ids = np.stack([rng.permutation(k)[:TOP_K] for _ in range(tokens)])[None].repeat(L, axis=0)
            x, w = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16), torch.rand(tokens, TOP_K)
            points.append((1.0, tokens * TOP_K, len(np.unique(ids[0]))))
            ms.append(float(np.median([rig.pass_ms(ids, x, w)[0, 0] for _ in range(3)])))
    (a, b, c), *_ = np.linalg.lstsq(np.array(points), np.array(ms), rcond=None)
    return float(a), float(b), float(c)


def record(rig: Rig, p: np.ndarray, tokens: int, passes: int, rng: np.random.Generator) -> tuple[Counts, TimingWindow]:
    """The linear server's dump and timing window over ``passes`` passes."""
    counts, ms, loads, active = [], [], [], []
    for _ in range(passes):
        experts = route(p, tokens, rng)
        x, w = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16), torch.rand(tokens, TOP_K)
        ms.append(rig.pass_ms(linear_slots(experts, rig.slots), x, w))
        n, k = slot_loads(experts, E // EP)
        loads.append(n)
        active.append(k)
        counts.append(np.stack([np.bincount(e.ravel(), minlength=E) for e in experts]))
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
    meta = {**provenance, "moe_layers": list(range(L)), "top_k": TOP_K, "passes_per_rank": [passes] * EP}
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


def truth(rig: Rig, layout: Layout, p: np.ndarray, tokens: int, passes: int, other: float, rng) -> tuple[float, float]:
    """The kernel's throughput ratio of ``layout`` over the linear one on fresh passes, each run under
    both in turn, and the gap between the ratios of the passes' two halves (the truth's own noise)."""
    now, cand = [], []
    for i in range(passes):
        experts = route(p, tokens, rng)
        x, w = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16), torch.rand(tokens, TOP_K)
        runs = [lambda: now.append(rig.pass_ms(linear_slots(experts, rig.slots), x, w).max(axis=1).sum())]
        runs.append(lambda: cand.append(rig.pass_ms(candidate_slots(layout, experts), x, w).max(axis=1).sum()))
        for run in runs[:: 1 - 2 * (i % 2)]:  # the two in turn, each first every other pass
            run()
    now_a, cand_a = np.array(now), np.array(cand)
    halves = [(other + now_a[h].mean()) / (other + cand_a[h].mean()) for h in np.array_split(np.arange(passes), 2)]
    return float((other + now_a.mean()) / (other + cand_a.mean())), float(abs(halves[0] - halves[1]))


def cell(skew: float, tokens: int, passes: int, rig: Rig, rng: np.random.Generator) -> dict:
    """One scene at ``tokens`` a pass: advise with and without active slots, and the truth."""
    p = scene(skew, rng)
    counts, window = record(rig, p, tokens, passes, rng)
    layout = fit(
        Counts(counts.total()[None], {"moe_layers": list(range(L))}), FitOptions(Geometry(E, REDUNDANT, EP), dispatch="static")
    )
    other = window.step_ms - float(np.asarray(window.rank_ms).max(axis=0).sum())
    true, noise = truth(rig, layout, p, tokens, passes, other, rng)
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
        "truth": true,
        "truth_halves_gap": noise,
        "advise": priced.predicted_throughput_ratio,
        "verdict": priced.verdict,
        "ends": None if "bound_ratio" not in d or at_zero is None else sorted((at_zero, d["bound_ratio"])),
        "c_ms": d.get("model", {}).get("c"),
        "slots": d.get("model", {}).get("slots"),
        "unpriced": unpriced.predicted_throughput_ratio,
        "unpriced_verdict": unpriced.verdict,
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


def _err(x: float | None, truth: float) -> str:
    return "   n/a" if x is None else f"{x - truth:+.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one cell (skew 1, 512 tokens a pass)")
    ap.add_argument("--passes", type=int, default=28, help="recorded passes and fresh truth passes per cell (default 28)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED)
    rig = Rig((E + REDUNDANT) // EP, SEED)
    grid = [(1.0, 512)] if args.quick else [(s, t) for s in SKEWS for t in TOKENS]
    a, b, c = kernel_costs(rig, rng)
    print(f"the kernel alone (one rank, one layer): {a:.3f} ms + {1000 * b:.2f} us x assignments + {c:.4f} ms x active slots")
    print(f"E={E} EP={EP} layers={L} top-k={TOP_K} hidden={HIDDEN} R={REDUNDANT} static, MoE {MOE_SHARE:.0%} of the step")
    print(
        f"{'skew':>5} {'tokens':>6} {'truth':>6} {'halves':>6} {'advise':>7} {'err':>7} {'verdict':>21} {'c':>12} {'c in [0, max]: ratio':>21} "
        f"{'unpriced':>8} {'err':>7}"
    )
    rows = []
    for skew, tokens in grid:
        row = cell(skew, tokens, args.passes, rig, rng)
        rows.append(row)
        print(_line(row))
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
