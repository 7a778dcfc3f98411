"""Observer overhead in a real vLLM CPU server, and the cost of exporting a field-size buffer.

Throughput (prefill-heavy batches of token-id prompts, tokens/s) in the same run:
- plugin idle vs no plugin: two servers one after the other (TP=2, no expert parallel, so the only
  difference is the observer's capture in the forward), rounds interleaved per server;
- recording on vs off: one server, rounds alternating between the two states.
The export's cost (field-size ring, 2 and 16 ranks) is measured by ``bench_export_dp.py``.

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
    idle, rec = tp["idle"] / tp["no_plugin"], tp["recording"] / tp["idle"]
    print(f"throughput tokens/s (median of {a.rounds}): no plugin {tp['no_plugin']:.0f}, plugin idle {tp['idle']:.0f}, "
          f"recording {tp['recording']:.0f}")
    print(f"  idle / no plugin   {idle:.3f}  (target >= 0.99)")
    print(f"  recording / off    {rec:.3f}  (target >= 0.97)")
    misses = [m for m, ok in (("idle/no-plugin < 0.99", idle >= 0.99), ("recording/off < 0.97", rec >= 0.97)) if not ok]
    if misses:
        print("MISSED: " + "; ".join(misses))
    return 1 if misses else 0


if __name__ == "__main__":
    raise SystemExit(main())
