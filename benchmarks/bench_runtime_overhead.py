"""Observer overhead in a real vLLM CPU server, and the cost of exporting a field-size buffer.

Throughput (prefill-heavy batches of token-id prompts, tokens/s) in the same run:
- plugin idle vs no plugin: two servers one after the other (TP=2, no expert parallel, so the only
  difference is the observer's capture in the forward), rounds interleaved per server;
- recording on vs off: one server, rounds alternating between the two states.
Export: a [512, 61, 256] int32 buffer (DeepSeek-V3 geometry) summed over a real 2-process Gloo
group and written by rank 0: seconds and peak extra memory per process.

    python benchmarks/bench_runtime_overhead.py [--rounds 6]     (needs the .venv from scripts/setup.sh)
Exits 1 when a target is missed: idle/no-plugin >= 0.99, recording/off >= 0.97.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from vllm_scene_eplb.harness.local_server import http, start_server


def _load(n_prompts: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 500, length).tolist() for _ in range(n_prompts)]


def _round(srv, prompts, max_tokens: int) -> float:
    """Tokens (prompt + generated) per second for one batch."""
    t0 = time.perf_counter()
    out = srv.complete(prompts, max_tokens)
    dt = time.perf_counter() - t0
    return (sum(len(p) for p in prompts) + sum(len(o) for o in out)) / dt


def throughput(model: Path, work: Path, rounds: int, prompts, max_tokens: int) -> dict:
    cfg = json.dumps({"scene_eplb": {"role": "prefill", "dump_dir": str(work / "dumps")}})
    res: dict[str, list[float]] = {"no_plugin": [], "idle": [], "recording": []}
    for name, plugins, extra in (("no_plugin", False, []), ("plugin", True, ["--additional-config", cfg])):
        srv = start_server(model, work, f"bench-{name}", extra=extra, plugins=plugins)
        try:
            srv.wait_ready()
            for _ in range(2):
                _round(srv, prompts, max_tokens)  # warm-up
            for _ in range(rounds):
                if name == "no_plugin":
                    res["no_plugin"].append(_round(srv, prompts, max_tokens))
                    continue
                res["idle"].append(_round(srv, prompts, max_tokens))
                assert http("POST", srv.url + "/start_expert_distribution_record")[0] == 200
                res["recording"].append(_round(srv, prompts, max_tokens))
                assert http("POST", srv.url + "/stop_expert_distribution_record")[0] == 200
        finally:
            srv.stop()
    return {k: statistics.median(v) for k, v in res.items()}


def _rss_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def _export_worker(rank: int, port: int, dump_dir: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from vllm_scene_eplb.runtime.export import export_counts

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = dist.new_group([0, 1], backend="gloo")
    ring = torch.randint(0, 1000, (512, 61, 256), dtype=torch.int32)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark (Linux)
    before = _rss_kb("VmRSS")
    t0 = time.perf_counter()
    export_counts(ring, group, dump_dir, {"role": "prefill", "model": "bench"}, tuple(ring.shape))
    dt = time.perf_counter() - t0
    peak = _rss_kb("VmHWM")
    Path(out, f"r{rank}.json").write_text(json.dumps({"seconds": dt, "peak_extra_mb": (peak - before) / 1024}))
    dist.destroy_process_group()


def export_cost() -> dict:
    import torch.multiprocessing as mp

    from vllm_scene_eplb.harness.local_server import free_port

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_export_worker, args=(free_port(), d, d), nprocs=2, join=True)
        per_rank = [json.loads(Path(d, f"r{r}.json").read_text()) for r in range(2)]
        size = sum(p.stat().st_size for p in Path(d).glob("*.npz"))
    return {"seconds": max(p["seconds"] for p in per_rank), "peak_extra_mb": max(p["peak_extra_mb"] for p in per_rank),
            "file_mb": size / 2**20, "buffer_mb": 512 * 61 * 256 * 4 / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--length", type=int, default=192)
    ap.add_argument("--max-tokens", type=int, default=4)
    a = ap.parse_args()
    from vllm_scene_eplb.harness.tiny_model import TinyMoeSpec, make_tiny_moe

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = make_tiny_moe(work / "model", TinyMoeSpec())
        tp = throughput(model, work, a.rounds, _load(a.prompts, a.length, 0), a.max_tokens)
    ex = export_cost()
    idle, rec = tp["idle"] / tp["no_plugin"], tp["recording"] / tp["idle"]
    print(f"throughput tokens/s (median of {a.rounds}): no plugin {tp['no_plugin']:.0f}, plugin idle {tp['idle']:.0f}, "
          f"recording {tp['recording']:.0f}")
    print(f"  idle / no plugin   {idle:.3f}  (target >= 0.99)")
    print(f"  recording / off    {rec:.3f}  (target >= 0.97)")
    print(f"export [512, 61, 256]: {ex['seconds']:.3f} s, peak extra memory {ex['peak_extra_mb']:.0f} MB per process "
          f"(buffer {ex['buffer_mb']:.0f} MB int32), file {ex['file_mb']:.1f} MB")
    misses = [m for m, ok in (("idle/no-plugin < 0.99", idle >= 0.99), ("recording/off < 0.97", rec >= 0.97)) if not ok]
    if misses:
        print("MISSED: " + "; ".join(misses))
    return 1 if misses else 0


if __name__ == "__main__":
    raise SystemExit(main())
