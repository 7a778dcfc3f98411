"""DeepSeek-V4-Flash's expert loading in seconds: the plugin's legacy mapping under a layout against
vLLM's stock mapping, in one run, through V4's released loader.

The geometry: 43 MoE layers, 256 routed experts, a layout with 16 redundant slots (272 a layer, none
of an expert's replicas on one rank), EP ranks splitting the slots linearly. The checkpoint's expert
tensors: 43 layers x 256 experts x 3 weights (w1, w2, w3) x 2 tensors each (the MXFP4 ``.weight``
and its ue8m0 ``.scale``) = 66,048, in checkpoint order. The mappings: the stock one, 256 x 3 = 768
entries; the plugin's, 43 x 272 x 3 = 35,088, each tensor iterating its own layer's 816.

Each load runs ``DeepseekV4ForCausalLM.load_weights`` as released (V4's ``WeightsMapper``,
``AutoWeightsLoader``, ``DeepseekV4Model.load_weights``: for every expert tensor the mapping loop,
substring match, ``weight_loader(..., return_success=True)``, break on success) on stand-in state
(tests/loader_rig.py: the checkpoint reader, the MoE layers' parameters, the weight loader's answer
with nothing copied): what is timed is the loader's Python, which is what the mapping changes; a
real load adds reading and copying 150-odd GB, alike on every side. Three loads a round, each round
in another order: ``stock`` (the plugin off), ``no layout`` (the plugin's load patches on: the
traced checkpoint and the journal, vLLM's mapping) and ``layout`` (the plugin's mapping too; its
journal must pass the load audit). Today's flat list (the plugin's entries as one plain list,
scanned whole for every tensor not on the rank) is timed on the tensors of ``--flat-layers``
layers and scaled to 66,048.

    python benchmarks/bench_v4_loader.py [--ep 16] [--rank 0] [--rounds 3] [--flat-layers 2] [--json OUT]
Exits 1 when the layout's load takes more than 1.2x the stock one (the best round of each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests/loader_rig.py

from tests.loader_rig import V4, load, ranks_slots  # noqa: E402
from vllm_scene_eplb.adapters.vllm import expert_loading  # noqa: E402
from vllm_scene_eplb.adapters.vllm.expert_loading import ExpertLoading  # noqa: E402
from vllm_scene_eplb.runtime.worker.load_audit import write_problems  # noqa: E402

LAYERS, E, REDUNDANT = 43, 256, 16
SEED = 20261203
TARGET = 1.2  # the plugin's load over the stock one, issue 44


def layout_rows(ep: int, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Per layer, every expert once and ``REDUNDANT`` of them twice, shuffled until no rank holds two
    replicas of an expert (vLLM's loader breaks at a rank's first replica)."""
    rows = {}
    for layer in range(LAYERS):
        while True:
            row = rng.permutation(np.concatenate([np.arange(E), rng.choice(E, REDUNDANT, replace=False)]))
            if all(len(set(part)) == len(part) for part in row.reshape(ep, -1)):
                rows[layer] = row
                break
    return rows


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(side: str, rows: dict[int, np.ndarray], ep: int, rank: int, names=None) -> float:
    """Seconds of one load: ``stock`` (no plugin, vLLM's 768-entry mapping over 256 slots), ``no layout``
    (the plugin's load patches on, the same mapping) or ``layout`` (the plugin's mapping under ``rows``,
    its journal checked by the load audit)."""
    loading = None if side == "stock" else ExpertLoading(rows if side == "layout" else {}, E)
    slots = E + REDUNDANT if side == "layout" else E
    local = ranks_slots(slots, ep, rank)
    seconds = timed(lambda: load(setattr, "deepseek-v4", list(rows), E, loading, local, names))
    problems = write_problems(loading.journal, rows, list(local)) if side == "layout" and names is None else []
    if problems:
        raise SystemExit(f"the plugin's load failed the load audit: {problems[:3]}")
    return seconds


def flat_per_tensor(rows: dict[int, np.ndarray], ep: int, rank: int, layers: list[int]) -> float:
    """Seconds a tensor with today's flat list (the plugin's entries as one plain list), on the tensors of ``layers``."""
    layered = expert_loading.qualified_mapping
    names = V4.names(layers, E)
    expert_loading.qualified_mapping = lambda *a: layered(*a)[:]  # type: ignore[assignment]
    try:
        return run("layout", rows, ep, rank, names) / len(names)
    finally:
        expert_loading.qualified_mapping = layered


SIDES = ("stock", "no layout", "layout")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ep", type=int, choices=(1, 2, 4, 8, 16), default=16, help="EP ranks (default 16)")
    ap.add_argument("--rank", type=int, default=0, help="the EP rank that loads (default 0)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three loads, each round in another order (default 3)")
    ap.add_argument("--flat-layers", type=int, default=2, help="layers whose tensors time today's flat list (0: skip)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    if not 0 <= a.rank < a.ep or a.rounds < 1:
        ap.error(f"--rank must be below --ep {a.ep} and --rounds at least 1")
    rows = layout_rows(a.ep, np.random.default_rng(SEED))
    tensors = len(V4.names(range(LAYERS), E))
    for side in SIDES:  # warm-up: the first load of a process pays for lazy imports and first calls
        run(side, rows, a.ep, a.rank, V4.names([0], E))
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(a.rounds):
        for side in SIDES[i % 3 :] + SIDES[: i % 3]:
            times[side].append(run(side, rows, a.ep, a.rank))
    best = {side: min(t) for side, t in times.items()}
    ratio = best["layout"] / best["stock"]
    flat_layers = [int(x) for x in np.linspace(0, LAYERS - 1, a.flat_layers).round()] if a.flat_layers else []
    flat = flat_per_tensor(rows, a.ep, a.rank, flat_layers) * tensors if flat_layers else None
    print(f"DeepSeek-V4-Flash expert loading, EP{a.ep} rank {a.rank}: {tensors} expert tensors, {a.rounds} rounds")
    for side, entries in zip(SIDES, (E * 3, E * 3, LAYERS * (E + REDUNDANT) * 3)):
        t = times[side]
        print(
            f"  {side:<9} mapping {entries:>6} entries: best {min(t):6.2f} s, median {statistics.median(t):6.2f} s "
            f"({1e6 * min(t) / tensors:5.1f} us a tensor)"
        )
    if flat is not None:
        print(
            f"  today's flat list: {flat:7.1f} s (timed on the {len(flat_layers) * E * 6} tensors of layers {flat_layers}, scaled)"
        )
    print(
        f"  layout / no layout  {best['layout'] / best['no layout']:.3f}  (the mapping, the plugin's load patches on both sides)"
    )
    print(f"  layout / stock      {ratio:.3f}  (target <= {TARGET})")
    if a.json:
        result = {"ep": a.ep, "rank": a.rank, "tensors": tensors, "seconds": times, "ratio": ratio, "flat_seconds": flat}
        Path(a.json).write_text(json.dumps(result, indent=2))
    if ratio > TARGET:
        print(f"MISSED: layout / stock {ratio:.3f} > {TARGET}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
