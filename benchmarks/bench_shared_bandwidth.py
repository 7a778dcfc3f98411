"""Two CPU ranks on one host share its memory system: the plugin's CPU expert op on issue 47's
experts (64 of 1024 x 256, fp32 as the engine check serves them), one rank a core, timed alone (the
other rank idle) and together (both running at once), in the same run.

``advise`` fits its count -> time model on the running server's window. Under the linear layout
one rank carries almost all the expert work (issue 47's skew: about 96% of the assignments on rank
0) while the other idles, so the model learns a slot's cost with the memory bandwidth to itself; a
balanced candidate has both ranks reading expert weights at once. On a device each rank has its own
memory and this ratio is 1; on co-located CPU ranks it is what a window of the linear layout cannot
show. Each pass reads ``--active`` slots' weights per layer (of 33 a rank, 4 layers: 415 MB a
rank, past any cache) for ``--tokens`` rows each; a plain read of 200 MB beside it gives the
bandwidth alone. Rounds alternate which mode runs first.

    python benchmarks/bench_shared_bandwidth.py [--rounds 3] [--passes 30] [--active 16] [--tokens 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from types import SimpleNamespace

import torch

L, SLOTS, HIDDEN, INTER = 4, 33, 256, 1024  # issue 47's engine check: 64 experts + 2 redundant over 2 ranks
STREAM_MB = 200


def _rank(core: int, active: int, tokens: int, passes: int, sync, out) -> None:
    """One rank on ``core``: ``passes`` expert passes (ms each, the sum over layers) and a 200 MB read (GB/s)."""
    from vllm._custom_ops import cpu_prepack_moe_weight

    from vllm_scene_eplb.adapters.vllm.cpu_moe import local_apply

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    torch.manual_seed(core)
    w13 = [cpu_prepack_moe_weight(torch.randn(SLOTS, 2 * INTER, HIDDEN) * 0.02, "vec") for _ in range(L)]
    w2 = [cpu_prepack_moe_weight(torch.randn(SLOTS, HIDDEN, INTER) * 0.02, "vec") for _ in range(L)]
    rows = active * tokens
    x, weights, result = torch.randn(rows, HIDDEN), torch.rand(rows, 1), torch.empty(rows, HIDDEN)
    experts, silu, emap = (
        SimpleNamespace(w1_bias=None, w2_bias=None, isa="vec"),
        SimpleNamespace(value="silu"),
        torch.arange(SLOTS, dtype=torch.int32),
    )
    stream = torch.ones(STREAM_MB * 250_000)
    stream.sum()
    sync.wait(timeout=600)  # every rank built its weights: the passes start together
    ms = []
    for n in range(passes):
        ids = torch.tensor([[(n * active + j // tokens) % SLOTS] for j in range(rows)], dtype=torch.int32)
        start = time.perf_counter()
        for layer in range(L):
            local_apply(experts, result, x, w13[layer], w2[layer], weights, ids, silu, emap, False)
        ms.append(1000 * (time.perf_counter() - start))
    sync.wait(timeout=600)  # and so do the reads
    reads = []
    for _ in range(5):
        start = time.perf_counter()
        stream.sum()
        reads.append(STREAM_MB / 1000 / (time.perf_counter() - start))
    out.put((core, statistics.median(ms), statistics.median(reads)))


def run(cores: list[int], a) -> dict[int, tuple[float, float]]:
    """The ranks on ``cores`` started together: per core (median ms a pass, median GB/s)."""
    ctx = mp.get_context("spawn")
    sync, out = ctx.Barrier(len(cores)), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(c, a.active, a.tokens, a.passes, sync, out)) for c in cores]
    for p in procs:
        p.start()
    got = {c: (m, g) for c, m, g in (out.get(timeout=600) for _ in procs)}
    for p in procs:
        p.join()
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=30, help="expert passes a rank per mode (the median kept)")
    ap.add_argument("--active", type=int, default=16, help="slots a pass reads per layer and rank")
    ap.add_argument("--tokens", type=int, default=2, help="rows routed to each active slot")
    ap.add_argument("--json", help="write the rounds here")
    a = ap.parse_args()
    if min(a.rounds, a.passes, a.active, a.tokens) < 1 or a.active > SLOTS:
        ap.error(f"--rounds, --passes, --tokens at least 1; --active 1 to {SLOTS}")
    if not {0, 1} <= os.sched_getaffinity(0):
        ap.error("needs cores 0 and 1")
    rounds = []
    for r in range(a.rounds):
        modes = ["alone", "together"] if r % 2 == 0 else ["together", "alone"]
        got: dict = {}
        for mode in modes:
            got[mode] = {**run([0], a), **run([1], a)} if mode == "alone" else run([0, 1], a)
        row = {mode: {"ms": [got[mode][c][0] for c in (0, 1)], "gbps": [got[mode][c][1] for c in (0, 1)]} for mode in got}
        row["pass_ratio"] = sum(row["together"]["ms"]) / sum(row["alone"]["ms"])
        row["read_ratio"] = sum(row["together"]["gbps"]) / sum(row["alone"]["gbps"])
        rounds.append(row)
        print(
            f"round {r + 1}: expert pass ms alone {row['alone']['ms'][0]:.3f} / {row['alone']['ms'][1]:.3f}, together "
            f"{row['together']['ms'][0]:.3f} / {row['together']['ms'][1]:.3f} (x{row['pass_ratio']:.3f}); read GB/s a core alone "
            f"{row['alone']['gbps'][0]:.1f} / {row['alone']['gbps'][1]:.1f}, together {row['together']['gbps'][0]:.1f} / "
            f"{row['together']['gbps'][1]:.1f} (x{row['read_ratio']:.3f})",
            flush=True,
        )
    pass_ratio = statistics.mean(r["pass_ratio"] for r in rounds)
    print(
        f"{a.active} slots x {a.tokens} rows a layer, 4 layers: an expert pass takes x{pass_ratio:.3f} as long with the other "
        f"rank running (mean of {a.rounds} rounds); a core reads x{statistics.mean(r['read_ratio'] for r in rounds):.3f} as fast"
    )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"args": vars(a), "rounds": rounds, "pass_ratio_mean": pass_ratio}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
