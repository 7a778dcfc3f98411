"""An EP rank loading the generated DeepSeek-V3 or DeepSeek-V4 through vLLM-Ascend's real
``NPUModelRunner.load_model`` with a scene_eplb layout (not a script: tests/scripts/ascend_deepseek.py
runs these loads for tests/ascend/test_vllm_ascend_deepseek.py).

Four loads of a model with its MTP drafter (``num_speculative_tokens`` 1: the drafter's MoE layer is
placed by the layout's drafter row), each as a fresh worker would run it (``LOADS``): the float model,
the W8A8 model (``--quantization ascend``; the MTP layer stays float), the W8A8 model again with a
scale loader that follows vLLM's linear expert map instead of the layout's (the bug class of SGLang
#17162: block scales that did not move with their weights), and the float model with the drafter's
expert weights loaded by vLLM's linear map (a mis-loaded drafter). Each reports the load audit's word or its refusal (raised once the weights loaded: what
memory holds is read either way) and, per MoE layer and local slot, which checkpoint experts each expert
weight's values match (compared as sorted values, so the kernel layouts vLLM-Ascend gives them after
loading do not matter) and a digest of its bytes (replicas on two ranks must hold the same bytes).

Real: vLLM 0.23.0, vLLM-Ascend 0.23.0.post1 (the platform's own ``pre_register_and_update``, its custom
ops, its models' registration (its DeepSeek-V4 over vLLM's), its ascend config, its model-parallel
groups, its MoE layers, its ModelSlim quantisation, the worker patches that touch DeepSeek and weight
loading), vLLM's distributed groups over Gloo, this plugin.
Stand-ins for the NPU runtime only, each where vLLM-Ascend asks it at build or load time:

- ``torch_npu`` (tests/ascend_standin): an identity ``npu_format_cast`` (ND / NZ are NPU formats);
- ``Tensor.npu()`` is the tensor, ``torch.npu.current_device()`` the CPU, and no accelerator behind
  the ``npu`` device name (``torch.distributed.barrier`` asks for it);
- the platform's ``device_type`` reads ``cpu``: the buffers V4's model allocates on it when built (the
  indexer's top-k buffer, the MTP hidden-state buffer, the rotary tables) are CPU tensors; V4's
  attention, compressor, indexer, caches and mHC parameters are otherwise built by their real code
  (none of their NPU kernels runs at build or load time);
- a process group's ``npu`` backend answers ``get_hccl_comm_name`` (the MC2 and all-to-all dispatchers
  read their HCCL communicator's name when they are built) and the model runner's memory profiler
  reads zero;
- the model runner is built without its ``__init__``, which allocates pinned NPU input buffers: the
  attributes ``load_model`` reads are set as ``__init__`` sets them, with the MC2 token capacity and
  mask it sets up, and its drafter is ``MtpDrafter`` (the MTP proposer's model loading only);
  ``vllm_ascend.patch.worker``'s package is replaced by the patches that touch DeepSeek and weight
  loading (its others import torchvision; ``patch_distributed`` makes HCCL device groups).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import sys
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist

WORKER_PATCHES = ("patch_process_weights_after_loading", "patch_weight_utils", "patch_deepseek_v2", "patch_deepseek_mtp")
PARAMS = ("w13_weight", "w2_weight")
QUANT_PARAMS = ("w13_weight_scale", "w13_weight_offset", "w2_weight_scale", "w2_weight_offset")


class HcclStandIn:
    """A process group's ``npu`` backend: the name of its HCCL communicator, which MoE dispatchers read."""

    def get_hccl_comm_name(self, rank: int) -> str:
        return f"hccl-stand-in-{rank}"


class NoDeviceMemory:
    """The model runner's device memory profiler: an NPU's memory counters, read as zero here."""

    consumed_memory = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def npu_runtime_stand_ins() -> None:
    import torch_npu  # noqa: F401  # the stand-in: torch.npu

    def no_accelerator(*args) -> torch.device:
        return torch.device("cpu")

    get_backend = dist.ProcessGroup._get_backend

    def backend(group, device):
        return HcclStandIn() if torch.device(device).type == "npu" else get_backend(group, device)

    torch.Tensor.npu = lambda self, *a, **k: self  # type: ignore[attr-defined]
    torch.npu.current_device = lambda: "cpu"  # type: ignore[attr-defined]
    torch._C._get_accelerator = no_accelerator  # type: ignore[assignment]
    dist.ProcessGroup._get_backend = backend  # type: ignore[method-assign]
    from vllm_ascend.platform import NPUPlatform

    NPUPlatform.device_type = "cpu"  # the buffers a model allocates on the platform's device (V4's) are CPU tensors


def import_vllm_ascend():
    """vLLM-Ascend's model runner module, the plugin and vLLM-Ascend's models registered (as
    ``vllm.general_plugins`` does)."""
    import vllm_ascend
    import vllm_ascend.patch

    worker_patches = types.ModuleType("vllm_ascend.patch.worker")
    worker_patches.__path__ = [vllm_ascend.patch.__path__[0] + "/worker"]
    sys.modules["vllm_ascend.patch.worker"] = worker_patches
    import vllm_scene_eplb.adapters.entry as entry

    entry.register()
    vllm_ascend.register_model()  # its `ascend_model` general plugin: its DeepSeek-V4 over vLLM's
    import vllm_ascend.worker.model_runner_v1 as mr

    mr.DeviceMemoryProfiler = NoDeviceMemory
    return mr


def server_config(model: str, scene_eplb: dict, world: int, quantization: str | None):
    """The config ``vllm serve MODEL --tensor-parallel-size WORLD --enable-expert-parallel --enforce-eager
    --speculative-config '{"method": "mtp", "num_speculative_tokens": 1}' --additional-config
    '{"scene_eplb": SCENE_EPLB}' [--quantization ascend]`` builds (with a layout, the plugin's config
    hook writes the expert map file and points vLLM-Ascend's ``expert_map_path`` at it)."""
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    model_config = ModelConfig(model=model, enforce_eager=True, quantization=quantization)
    parallel_config = ParallelConfig(tensor_parallel_size=world, enable_expert_parallel=True)
    mtp = SpeculativeConfig(
        method="mtp", num_speculative_tokens=1, target_model_config=model_config, target_parallel_config=parallel_config
    )
    return VllmConfig(
        model_config=model_config,
        parallel_config=parallel_config,
        speculative_config=mtp,
        device_config=DeviceConfig(device="cpu"),
        additional_config={"scene_eplb": scene_eplb},
    )


class MtpDrafter:
    """vLLM-Ascend's MTP proposer as far as the model runner's ``load_model`` reaches it: its real
    ``_get_model`` (vLLM's ``_create_draft_vllm_config``, ``get_model`` on the draft model config: the
    MTP model vLLM-Ascend registers, its weights from the same checkpoint). The proposer's
    ``__init__`` (device buffers, attention groups) and the rest of its ``load_model`` (attention
    layers and shared embeddings wired to the target) are not run."""

    def __init__(self, vllm_config):
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
        from vllm_ascend.spec_decode.llm_base_proposer import AscendSpecDecodeBaseProposer

        self.vllm_config, self.speculative_config, self.method = vllm_config, vllm_config.speculative_config, "mtp"
        self._create_draft_vllm_config = functools.partial(SpecDecodeBaseProposer._create_draft_vllm_config, self)
        self._get_model = functools.partial(AscendSpecDecodeBaseProposer._get_model, self)
        self.model = None

    def load_model(self, target) -> None:
        self.model = self._get_model()


def load(mr, vc, rank: int, world: int, init: str) -> tuple:
    """vLLM-Ascend's ``NPUModelRunner.load_model`` (wrapped by the plugin: configure, load, bind) as a
    fresh worker runs it: its worker-side setup first (ops, ascend config, distributed groups once).
    Returns the runner and the plugin's refusal (None: it loaded), raised after the weights loaded."""
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment, model_parallel_is_initialized
    from vllm_ascend.ascend_config import get_ascend_config, init_ascend_config
    from vllm_ascend.distributed.parallel_state import init_ascend_model_parallel
    from vllm_ascend.ops.fused_moe.fused_moe import AscendFusedMoE
    from vllm_ascend.utils import register_ascend_customop

    from vllm_scene_eplb.errors import SceneEplbError

    for name in WORKER_PATCHES:
        importlib.import_module(f"vllm_ascend.patch.worker.{name}")
    register_ascend_customop(vc)
    init_ascend_config(vc)
    if not model_parallel_is_initialized():
        init_distributed_environment(world, rank, init, rank, "gloo")
        ensure_model_parallel_initialized(world, 1)
        init_ascend_model_parallel(vc.parallel_config)
    AscendFusedMoE.moe_counter = -1  # a worker's MoE layers count from 0 (their row of the expert map file)
    runner = mr.NPUModelRunner.__new__(mr.NPUModelRunner)
    runner.vllm_config, runner.model_config, runner.compilation_config = vc, vc.model_config, vc.compilation_config
    runner.ascend_config, runner.device, runner.lora_config = get_ascend_config(), torch.device("cpu"), None
    runner.drafter, runner.use_aux_hidden_state_outputs = MtpDrafter(vc), False
    runner.eplb_enable = runner.ascend_config.eplb_config.expert_map_path is not None
    mr.set_mc2_tokens_capacity(vc, vc.scheduler_config.max_num_seqs, 1)
    mr.set_mc2_mask(vc, runner.device)
    try:
        runner.load_model()
    except SceneEplbError as exc:
        return runner, str(exc)
    return runner, None


@contextlib.contextmanager
def by_linear_map(num_experts: int, bugged):
    """A loader bug on purpose: each expert write that ``bugged(layer, weight_name)`` picks goes through
    vLLM's linear expert map (expert e to its default slot), the others through the layout's map."""
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map
    from vllm_ascend.ops.fused_moe.fused_moe import AscendFusedMoE

    installed = AscendFusedMoE.weight_loader

    def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        if not bugged(self, weight_name):
            return installed(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success)
        manager = self.expert_map_manager
        saved = manager._expert_map
        manager._expert_map = determine_expert_map(self.ep_size, self.ep_rank, num_experts)[1]
        try:
            return installed(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success)
        finally:
            manager._expert_map = saved

    AscendFusedMoE.weight_loader = weight_loader  # bound into the parameters of the model built next
    try:
        yield
    finally:
        AscendFusedMoE.weight_loader = installed


def scales_by_linear_map(layer, weight_name: str) -> bool:
    """SGLang #17162's bug class: every weight scale left where vLLM's linear map puts it."""
    return "weight_scale" in weight_name


def drafter_by_linear_map(main_moe_layers: int):
    """A drafter's expert weights (its MoE layers: vLLM-Ascend's MoE index past the main model's)
    loaded by vLLM's linear map, the main model's by the layout's."""
    return lambda layer, weight_name: layer.moe_instance_id >= main_moe_layers


# Per model type: a routed expert's checkpoint tensor name in a model layer and in an MTP layer (the
# drafter's, model layer num_layers + i), and its gate, up and down projections' names (DeepSeek-V3 in
# transformers' names, DeepSeek-V4 in DeepSeek's own, which vLLM-Ascend's V4 loader renames)
EXPERT_NAMES = {
    "deepseek_v3": (
        "model.layers.{layer}.mlp.experts.{e}.{proj}.{suffix}",
        "model.layers.{layer}.mlp.experts.{e}.{proj}.{suffix}",
        ("gate_proj", "up_proj", "down_proj"),
    ),
    "deepseek_v4": (
        "layers.{layer}.ffn.experts.{e}.{proj}.{suffix}",
        "mtp.{mtp}.ffn.experts.{e}.{proj}.{suffix}",
        ("w1", "w3", "w2"),
    ),
}


@functools.cache
def checkpoint(model: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(model) / "model.safetensors"))


def checkpoint_experts(model: str, hf, layer: int, param: str) -> list[torch.Tensor]:
    """Each checkpoint expert's tensor of ``param`` in model ``layer`` (past the model's layers: an MTP
    layer), as the loader assembles it (w13: gate then up; w2: down)."""
    sd = checkpoint(model)
    kind, _, suffix = param.partition("_")
    name, mtp_name, (gate, up, down) = EXPERT_NAMES[hf.model_type]
    mtp = layer - hf.num_hidden_layers
    name = name if mtp < 0 else mtp_name
    projections = (gate, up) if kind == "w13" else (down,)
    return [
        torch.cat([sd[name.format(layer=layer, mtp=mtp, e=e, proj=proj, suffix=suffix)] for proj in projections])
        for e in range(hf.n_routed_experts)
    ]


def slot_contents(model: str, hf, layers: dict, quantized: bool) -> dict:
    """Per MoE layer (model layer -> its ``AscendFusedMoE``): its global slots on this rank and, per
    expert weight it holds and slot, the checkpoint experts whose values it holds (sorted values
    compared after the cast to the parameter's dtype) and a digest of its bytes."""
    out = {}
    for index, layer in layers.items():
        base = layer.ep_rank * layer.local_num_experts
        entry: dict = {"slots": list(range(base, base + layer.local_num_experts)), "matches": {}, "digests": {}}
        for param in PARAMS + (QUANT_PARAMS if quantized else ()):
            if getattr(layer, param, None) is None:  # a float layer of a W8A8 model (the MTP layer) has no scales
                continue
            data = getattr(layer, param).data
            experts = [t.to(data.dtype).flatten().sort().values for t in checkpoint_experts(model, hf, index, param)]
            held = [data[i].flatten().sort().values for i in range(layer.local_num_experts)]
            entry["matches"][param] = [[e for e, t in enumerate(experts) if torch.equal(t, h)] for h in held]
            entry["digests"][param] = [
                hashlib.sha1(data[i].contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                for i in range(layer.local_num_experts)
            ]
        out[str(index)] = entry
    return out


# (case, the W8A8 checkpoint)
LOADS = (("float", False), ("w8a8", True), ("w8a8_scales_by_linear_map", True), ("float_drafter_by_linear_map", False))


def start(ready: str):
    """A worker process up to its first load: the NPU runtime's stand-ins, what `vllm serve` runs first
    (the platform's ``pre_register_and_update``: global patches, the "ascend" quantisation), vLLM-Ascend's
    model runner module (returned); then the files the test makes while this imports (``ready`` appears
    once they are written)."""
    npu_runtime_stand_ins()
    from vllm.platforms import current_platform

    current_platform.pre_register_and_update()
    mr = import_vllm_ascend()
    deadline = time.monotonic() + 120
    while not Path(ready).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{ready} never appeared")
        time.sleep(0.1)
    return mr


def load_case(mr, case: str, model: str, scene_eplb: dict, rank: int, world: int, init: str) -> tuple:
    """One load of ``LOADS`` (or a float load with other ``scene_eplb`` settings) as a fresh worker runs
    it: (the runner, its config, what it reports: the load audit's word or its refusal, the EP rank and
    what each slot holds)."""
    from vllm.config import set_current_vllm_config

    from vllm_scene_eplb.adapters.vllm_ascend import worker_plugin

    quantization = "ascend" if case.startswith("w8a8") else None
    vc = server_config(model, scene_eplb, world, quantization)
    hf = vc.model_config.hf_config
    bugs = {
        "w8a8_scales_by_linear_map": scales_by_linear_map,
        "float_drafter_by_linear_map": drafter_by_linear_map(len(hf_moe_layers(hf))),
    }
    bug = by_linear_map(hf.n_routed_experts, bugs[case]) if case in bugs else contextlib.nullcontext()
    with set_current_vllm_config(vc), bug:
        runner, refused = load(mr, vc, rank, world, init)
    rt = worker_plugin.current()
    assert isinstance(rt, worker_plugin.AscendWorkerPlugin)  # the flag is on
    layers = dict(zip(rt.model.moe_layers, worker_plugin.moe_layers(runner.model)))
    drafter = worker_plugin.drafter_moe_layers(runner)
    layers |= dict(zip(worker_plugin.drafter_layer_ids(hf.num_hidden_layers, len(drafter)), drafter))
    report = {
        "load_audit": rt.status().load_audit,
        "refused": refused,
        "ep_rank": rt.ep_rank,
        "drafter_layers": rt.drafter_layer_ids,
        "layers": slot_contents(model, hf, layers, quantization is not None),
    }
    return runner, vc, report


def hf_moe_layers(hf) -> list[int]:
    """The model's MoE layers by its config (as the plugin reads them)."""
    from vllm_scene_eplb.planning.model_geometry import from_hf_config

    return list(from_hf_config(hf.to_dict()).moe_layers)


def layout_loads(mr, models: tuple, layout: str, dump: str, rank: int, world: int, init: str, after_float=None) -> dict:
    """The ``LOADS`` of ``models`` (float, W8A8) with ``layout``, each one's report by case;
    ``after_float(runner, config)``, when given, runs on the float model while it is loaded."""
    out = {}
    for case, quantized in LOADS:
        runner, vc, out[case] = load_case(mr, case, models[quantized], {"layout": layout, "dump_dir": dump}, rank, world, init)
        if case == "float" and after_float is not None:
            after_float(runner, vc)
    return out
