"""`scene-eplb preflight --model DIR --dp N --tp N --max-num-seqs N [...]`: whether a server recipe
fits its devices, per rank (``sizing``); a recipe that does not fit is refused with the numbers, so
the recipes run it before they start a server."""

from __future__ import annotations

from dataclasses import replace

from ..errors import SceneEplbError
from ..formats import read_layout
from ..layouts.layout import Geometry
from ..planning.memory import ASCEND_QUANTIZATION, GIB, checkpoint_quantization, cost_sentence, geometry_cost, read_model_memory
from ..planning.model_files import read_model
from ..planning.sizing import ENGINE_NAMES, ENGINES, MIB, VLLM_ASCEND, Recipe, size_rank
from .arguments import geometry_args, hint, model_args
from .options import integer, number

HELP = "check that a server recipe's weights, MC2 buffer and KV cache fit each device"
DESCRIPTION = (
    "Per rank of a DP x TP server with expert parallelism over all its ranks: non-routed and routed "
    "weights (the layout's slots) in the checkpoint's own format, what the engine keeps beside them, "
    "vLLM-Ascend's MC2 HCCL buffer, a reserve, and the KV cache left under gpu_memory_utilization "
    "(max_model_len and max_num_seqs that fit). Exit 2 with the numbers when the recipe does not fit, "
    "or when --quantization is not what the checkpoint is. Arithmetic from the model's config, not measured."
)
ENGINE_HELP = (
    "the engine that serves the recipe (default vllm-ascend: this preflight's default device is a 910C die, "
    "which vLLM-Ascend serves, and the recipes that run it are vLLM-Ascend's). Only vllm-ascend adds its MC2 "
    "HCCL buffer, MLAPO's kept weights, its EPLB swap buffer, its sequence-parallel replication and its V4 pages"
)


def add_arguments(p) -> None:
    model_args(p, required=True)
    p.add_argument("--engine", choices=ENGINES, default=VLLM_ASCEND, help=ENGINE_HELP)
    s = p.add_argument_group("the server recipe")
    s.add_argument("--dp", type=integer(1), required=True, help="--data-parallel-size")
    s.add_argument("--tp", type=integer(1), required=True, help="--tensor-parallel-size")
    slots = s.add_mutually_exclusive_group()
    slots.add_argument("--layout", metavar="FILE", help="the layout the server loads (its slots per rank)")
    slots.add_argument("--redundant", type=integer(0), default=0, help="redundant slots R without a layout (default 0)")
    s.add_argument("--max-model-len", type=integer(1), help="--max-model-len (default: the config's max_position_embeddings)")
    s.add_argument("--max-num-seqs", type=integer(1), required=True, help="--max-num-seqs")
    s.add_argument("--max-num-batched-tokens", type=integer(1), default=8192, help="--max-num-batched-tokens (default 8192)")
    s.add_argument("--gpu-memory-utilization", type=number(0.01, 1.0), default=0.9, help="--gpu-memory-utilization (default 0.9)")
    s.add_argument(
        "--quantization",
        metavar="METHOD",
        help="the server's --quantization, checked against the checkpoint's own format (ModelSlim's description: "
        "ascend; else the config's quantization_config.quant_method): a mismatch is refused (default: not checked)",
    )
    s.add_argument("--enforce-eager", action="store_true", help="no ACL graphs (the MC2 capacity is then max_num_seqs)")
    s.add_argument(
        "--block-size", type=integer(1), default=128, help="--block-size (default 128; vLLM-Ascend's V4 pages follow it)"
    )
    s.add_argument(
        "--shared-prefix",
        type=integer(0),
        default=0,
        metavar="TOKENS",
        help="tokens every sequence starts with, held once by the prefix cache (--enable-prefix-caching; default 0)",
    )
    s.add_argument("--prefill-mc2", action="store_true", help="vLLM-Ascend's enable_prefill_mc2")
    s.add_argument("--kv-consumer", action="store_true", help="a D server (kv_consumer): MLAPO's kept weights counted")
    s.add_argument("--native-eplb", action="store_true", help="vLLM-Ascend's dynamic EPLB on (NATIVE_EPLB=1): its swap buffer")
    s.add_argument("--flashcomm1", action="store_true", help="VLLM_ASCEND_ENABLE_FLASHCOMM1=1: the shared experts replicated")
    s.add_argument("--shared-expert-dp", action="store_true", help="vLLM-Ascend's enable_shared_expert_dp: the same")
    s.add_argument("--dsa-cp", action="store_true", help="vLLM-Ascend's enable_dsa_cp: DeepSeek-V4's wq_b replicated")
    s.add_argument(
        "--speculative-tokens", type=integer(0), default=0, help="MTP num_speculative_tokens (default 0): the drafter's layer"
    )
    n = p.add_argument_group("the node")
    n.add_argument("--device-memory-gib", type=number(1.0, 1e6), default=64.0, help="one die's memory (default 64: a 910C die)")
    n.add_argument(
        "--reserve-gib",
        type=number(0.0, 1e6),
        default=4.0,
        help="activations, graphs and the other communicators, an estimate (default 4)",
    )
    n.add_argument("--hccl-buffsize", type=integer(1), metavar="MB", help="HCCL_BUFFSIZE where set (checked against MC2's need)")
    p.add_argument("--shell", action="store_true", help="on a fit, print HCCL_BUFFSIZE=MB for a recipe to eval (vllm-ascend)")
    geometry_args(p)


def check_quantization(given: str | None, cfg: dict, modelslim: dict | None, path: str, engine: str) -> str:
    """The checkpoint's format in words; a ``--quantization`` the server would refuse (or load wrong) is
    refused: ``ascend`` without ModelSlim's description, or on vLLM; any other name but the config's own."""
    found = checkpoint_quantization(cfg, modelslim, path)
    said = found or "none (unquantised)"
    if given is None:
        return said
    if given == ASCEND_QUANTIZATION and engine != VLLM_ASCEND:
        raise SceneEplbError(f"--quantization {given} is vLLM-Ascend's ModelSlim reader: the recipe is for {engine}")
    if given != found:
        where = "quant_model_description.json beside it" if found == ASCEND_QUANTIZATION else "config.json's quantization_config"
        raise SceneEplbError(
            f"the recipe passes --quantization {given}, the checkpoint is {said} ({where if found else 'no quantization_config, no ModelSlim description'}): "
            "the server would refuse it or load it wrong"
        )
    return said


def run(args, console) -> None:
    if args.shell and args.engine != VLLM_ASCEND:
        raise SceneEplbError("--shell prints vLLM-Ascend's HCCL_BUFFSIZE: the recipe is for vllm")
    model = read_model(args.model)
    memory = read_model_memory(model, args.kv_cache_dtype, args.expert_bytes)
    cfg, modelslim, path = model.cfg, model.modelslim, model.where
    quantization = check_quantization(args.quantization, cfg, modelslim, path, args.engine)
    experts = model.geometry.num_experts
    ep = args.dp * args.tp
    layout = read_layout(args.layout, hint(args)) if args.layout else None
    geometry = None if layout is None else layout.geometry
    if geometry is not None and geometry.ep_size != ep:
        raise SceneEplbError(f"the layout is for EP {geometry.ep_size}, the recipe has DP {args.dp} x TP {args.tp} = {ep}")
    physical = geometry.num_physical if geometry is not None else experts + args.redundant
    if physical % ep:
        raise SceneEplbError(f"{physical} expert slots do not divide over EP {ep}")
    slots = geometry or Geometry(experts, args.redundant, ep)  # the redundant slots priced against KV
    max_len = args.max_model_len or model.fields().integer("max_position_embeddings", 1, default=None)
    if max_len is None:
        raise SceneEplbError("the config has no max_position_embeddings: give --max-model-len")
    recipe = Recipe(
        dp=args.dp,
        tp=args.tp,
        slots_per_rank=physical // ep,
        max_model_len=max_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        device_bytes=int(args.device_memory_gib * GIB),
        reserve_bytes=int(args.reserve_gib * GIB),
        graphs=not args.enforce_eager,
        prefill_mc2=args.prefill_mc2,
        hccl_buffsize_mb=args.hccl_buffsize,
        kv_consumer=args.kv_consumer,
        native_eplb=args.native_eplb,
        speculative_tokens=args.speculative_tokens,
        engine=args.engine,
        flashcomm1=args.flashcomm1,
        dsa_cp=args.dsa_cp,
        shared_expert_dp=args.shared_expert_dp,
        block_size=args.block_size,
        shared_prefix=args.shared_prefix,
    )
    result = size_rank(recipe, memory, cfg, modelslim, path, args.kv_cache_dtype)
    priced = replace(memory, kv_bytes_per_token=result.kv_bytes_per_token, kv_format=result.kv_format)
    # with MTP on, the drafter's MoE layer holds the same slots as the target's (its redundant ones too)
    drafter = ((len(layout.drafter_layers) if layout else 0) or 1) if args.speculative_tokens else 0
    cost = geometry_cost(priced, slots, drafter)
    redundant = {**cost, "summary": cost_sentence(cost, slots)}
    name = f"DP{args.dp} x TP{args.tp}, {recipe.slots_per_rank} slots per rank, max_model_len {max_len:,}"
    mc2 = (
        f"  MC2 {result.mc2_tokens_per_rank} tokens per rank: HCCL_BUFFSIZE >= {result.hccl_buffsize_mb} MB "
        f"(buffer {result.hccl_bytes / GIB:.2f} GiB), "
        if recipe.ascend
        else "  no MC2 (vLLM; its MoE all-to-all buffers are not priced), "
    )
    shared = f", {args.shared_prefix:,} shared" if args.shared_prefix else ""
    text = (
        f"preflight {name}, max_num_seqs {args.max_num_seqs}{shared}, on {ENGINE_NAMES[args.engine]}, per rank:\n"
        f"  checkpoint {quantization}: non-routed weights {result.non_routed_bytes / GIB:.2f} GiB, routed weights "
        f"{result.routed_bytes / GIB:.2f} GiB ({memory.expert_format})\n"
        + "".join(f"  kept by {ENGINE_NAMES[args.engine]}: {copy} {size / GIB:.2f} GiB\n" for copy, size in result.copies)
        + mc2
        + f"reserve {result.reserve_bytes / GIB:.2f} GiB\n"
        f"  budget {args.gpu_memory_utilization:g} x {args.device_memory_gib:g} GiB = {result.budget_bytes / GIB:.2f} GiB; "
        f"KV cache {result.kv_bytes / GIB:.2f} GiB = {result.kv_tokens:,} tokens of {result.kv_bytes_per_token:,} B "
        + (
            f"beside {result.kv_state_bytes / GIB:.2f} GiB of windows and compressor states ({args.max_num_seqs} x "
            f"{result.kv_bytes_per_sequence / MIB:.1f} MiB per sequence and the step's {args.max_num_batched_tokens:,} tokens) "
            if result.kv_bytes_per_sequence
            else ""
        )
        + f"({result.kv_format})\n"
        + (f"  redundant slots: {redundant['summary']}\n" if slots.num_redundant else "")
        + f"  fits: max_model_len up to {result.max_model_len_fit:,}, {result.max_num_seqs_fit} sequences of {max_len:,} tokens{shared}\n"
        "  arithmetic from the config, not measured on a device"
    )
    if result.problems:
        console.say(text)
        raise SceneEplbError(f"preflight refuses {name}: " + "; ".join(result.problems))
    if args.shell:
        print(f"HCCL_BUFFSIZE={args.hccl_buffsize or result.hccl_buffsize_mb}")
        return
    payload = {"recipe": name, "engine": args.engine, "quantization": quantization, **result.to_dict(), "redundant": redundant}
    console.emit(payload, text + "\n  the recipe fits")
