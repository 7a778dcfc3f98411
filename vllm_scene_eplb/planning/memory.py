"""What redundant expert slots cost in device memory, and how much KV cache that memory would hold.

Every redundant slot holds a full copy of one routed expert's weights in every MoE layer, on the
rank that gets it: memory that comes out of that rank's KV cache. From a Hugging Face model folder
(``config.json``, its ``quantization_config``, or vLLM-Ascend's ModelSlim
``quant_model_description.json``) this module prices one expert and one token of KV cache:

- ``bytes_per_expert``: gate, up and down projections of one routed expert in one MoE layer
  (3 x hidden x moe_intermediate weights), at the checkpoint's dtype or quantisation, scales included;
- ``kv_bytes_per_token``: one token's KV cache over all layers on one rank with attention DP
  (TP 1, as the P recipe runs): DeepSeek's MLA keeps one compressed latent (kv_lora_rank +
  qk_rope_head_dim) per layer; DeepSeek-V4 one compressed entry per ``compress_ratio`` tokens, and
  on its ratio-4 layers an indexer key per 4 tokens (``V4Cache``); other attention keeps K and V per KV head;
- ``kv_bytes_per_sequence``: what a sequence holds whatever its length: DeepSeek-V4's sliding
  window and compressor states (0 for other attention).

Not counted: the MTP layer (``num_nextn_predict_layers``), which vLLM-Ascend places with the same
slot count, and activation workspace. Pure numpy-free arithmetic, no engine; the model comes read (``model_files.read_model``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction

from ..errors import SceneEplbError
from ..layouts.layout import Geometry
from .model_files import ModelFiles
from .model_geometry import ConfigFields, V4Shape, v4_compress_ratios

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
KV_CACHE_DTYPES = ("auto",) + tuple(DTYPE_BYTES)
GIB = 1024**3


@dataclass(frozen=True)
class ModelMemory:
    """One routed expert's and one KV token's bytes on a rank, and how they were priced."""

    bytes_per_expert: int
    expert_format: str  # e.g. "bfloat16", "fp8 with 128x128 block scales", "W8A8_DYNAMIC (ModelSlim)"
    kv_bytes_per_token: int
    kv_format: str  # e.g. "MLA latent 512 + rope 64 per layer, bfloat16"
    num_moe_layers: int
    kv_bytes_per_sequence: int = 0  # DeepSeek-V4's window and compressor states


INDEX_KEY_BLOCK = 128  # vLLM's V4 indexer keys: fp8 with one float32 scale per 128 values
FLOAT32_BYTES = 4  # vLLM's V4 compressor state and hyper-connection weights are float32


@dataclass(frozen=True)
class V4Cache:
    """One rank's DeepSeek-V4 cache (attention DP, TP 1) as vLLM 0.32's V4 KV cache specs lay it out
    (``attention.py``, ``compressor.py``): every layer a sliding window of ``window`` entries per
    sequence; a ratio-r layer (r > 1) one compressed entry per r tokens and its compressor's float32
    state (kv and score, overlap x r tokens of 2 x overlap x head_dim); a ratio-4 layer also an
    indexer key per 4 tokens (fp8, 132 B at 128) and its compressor's state. An entry is ``head_dim``
    at the KV dtype (vLLM's fp8_ds_mla packing, 584 B, is not priced)."""

    shape: V4Shape
    entry_bytes: int  # one KV entry (window or compressed): head_dim at the KV dtype
    dtype: str

    @property
    def index_key_bytes(self) -> int:
        return self.shape.index_head_dim + FLOAT32_BYTES * math.ceil(self.shape.index_head_dim / INDEX_KEY_BLOCK)

    def layer_token_bytes(self, ratio: int) -> Fraction:
        """A layer's bytes per token of context: its compressed entries and indexer keys."""
        if ratio == 0:
            return Fraction(0)
        return Fraction(self.entry_bytes + (self.index_key_bytes if ratio == 4 else 0), ratio)

    def layer_state_row(self, ratio: int) -> int:
        """A layer's window and compressor-state bytes per token they hold: a window entry, and at
        ratio > 1 the compressors' float32 kv and score rows (2 x overlap x head_dim, and the indexer's)."""
        if ratio == 0:
            return self.entry_bytes
        o = self.shape.overlap(ratio)
        dims = self.shape.head_dim + (self.shape.index_head_dim if ratio == 4 else 0)
        return self.entry_bytes + 2 * o * dims * FLOAT32_BYTES

    def layer_state_bytes(self, ratio: int) -> int:
        """A layer's bytes per sequence, whatever its length: ``window`` window entries and the
        compressors' rows of their last overlap x ratio tokens."""
        compressor = self.layer_state_row(ratio) - self.entry_bytes
        return self.shape.window * self.entry_bytes + self.shape.overlap(ratio) * ratio * compressor

    @property
    def state_row(self) -> int:
        """Window and compressor-state bytes per in-flight token over all layers: vLLM holds a
        sequence's windows for its last window - 1 tokens plus the tokens being computed."""
        return sum(self.layer_state_row(r) for r in self.shape.compress_ratios)

    @property
    def per_token(self) -> int:
        return math.ceil(sum(self.layer_token_bytes(r) for r in self.shape.compress_ratios))

    @property
    def per_sequence(self) -> int:
        return sum(self.layer_state_bytes(r) for r in self.shape.compress_ratios)

    def describe(self) -> str:
        s = self.shape
        return (
            f"DeepSeek-V4 as vLLM 0.32 lays it out, {self.dtype}: {s.layers_at(4)} layers at ratio 4 (an entry of {s.head_dim} and an indexer key "
            f"of {self.index_key_bytes} B per 4 tokens), {s.layers_at(128)} at 128, {s.layers_at(0)} window only"
        )


def v4_cache(shape: V4Shape, cfg: dict, kv_cache_dtype: str = "auto", path: str | None = None) -> V4Cache:
    """DeepSeek-V4's cache at ``kv_cache_dtype`` ("auto": the model dtype)."""
    dtype = _model_dtype(ConfigFields(cfg, path)) if kv_cache_dtype == "auto" else kv_cache_dtype
    return V4Cache(shape, shape.head_dim * _dtype_bytes(dtype, "kv cache dtype"), dtype)


def _dtype_bytes(name: str, what: str) -> int:
    if name not in DTYPE_BYTES:
        raise SceneEplbError(f"{what} {name!r} is not one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def _model_dtype(f: ConfigFields) -> str:
    return f.text("torch_dtype", "") or f.text("dtype", "bfloat16")


def _expert_shape(f: ConfigFields) -> tuple[int, int]:
    """(hidden, moe_intermediate) of one routed expert."""
    if not f.has("hidden_size") or not (f.has("moe_intermediate_size") or f.has("intermediate_size")):
        raise SceneEplbError("config has no hidden_size and moe_intermediate_size (or intermediate_size)", f.path)
    inter_key = "moe_intermediate_size" if f.has("moe_intermediate_size") else "intermediate_size"
    return f.integer("hidden_size", 1), f.integer(inter_key, 1)


def _blocks(rows: int, cols: int, block: tuple[int, int]) -> int:
    return math.ceil(rows / block[0]) * math.ceil(cols / block[1])


def expert_bytes(cfg: dict, modelslim: dict | None = None, path: str | None = None) -> tuple[int, str]:
    """Bytes of one routed expert in one MoE layer, and how they were priced."""
    f = ConfigFields(cfg, path)
    hidden, inter = _expert_shape(f)
    params = 3 * hidden * inter
    dtype = _model_dtype(f)
    if modelslim is not None:
        kind = next((v for k, v in modelslim.items() if ".experts." in k and k.endswith(".weight")), "FLOAT")
        if kind == "FLOAT":
            return params * _dtype_bytes(dtype, "torch_dtype"), f"{dtype} (ModelSlim FLOAT)"
        if kind in ("W8A8_DYNAMIC", "W8A8"):
            # int8 weights plus a scale and an offset per output channel, in the model dtype
            channels = 2 * inter + hidden
            return params + 2 * channels * _dtype_bytes(
                dtype, "torch_dtype"
            ), f"{kind} (ModelSlim: int8, per-channel scale and offset)"
        raise SceneEplbError(f"ModelSlim expert quantisation {kind!r} is not priced here: pass --expert-bytes")
    quant = f.obj("quantization_config")
    if not quant:  # unquantized: vLLM reads DeepSeek-V4's expert_dtype only through its quantization config
        return params * _dtype_bytes(dtype, "torch_dtype"), dtype
    experts = f.text("expert_dtype", "")
    if experts == "fp4":  # DeepSeek-V4's MXFP4 experts: two weights per byte, one ue8m0 scale per 32
        return params // 2 + params // 32, "MXFP4 (expert_dtype fp4: 4-bit weights, a ue8m0 scale per 32)"
    if experts not in ("", "fp8"):
        raise SceneEplbError(f"config expert_dtype {experts!r} is not priced here: pass --expert-bytes", path)
    q = ConfigFields(quant, path)
    method = q.text("quant_method", "")
    if method == "fp8":
        block = quant.get("weight_block_size")
        if block:  # one scale per block of each projection (DeepSeek-V3's: 128x128 float32; V4's ue8m0, a byte)
            if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b >= 1 for b in block)):
                raise SceneEplbError(
                    f"config quantization_config.weight_block_size must be two integers >= 1, got {block!r}", path
                )
            b = (block[0], block[1])
            scales = 2 * _blocks(inter, hidden, b) + _blocks(hidden, inter, b)
            ue8m0 = q.text("scale_fmt", "") == "ue8m0"
            return params + (1 if ue8m0 else 4) * scales, f"fp8 with {b[0]}x{b[1]} {'ue8m0 ' if ue8m0 else ''}block scales"
        return params + 3 * 4, "fp8 with per-tensor scales"
    raise SceneEplbError(f"quantization method {method!r} is not priced here: pass --expert-bytes")


def linear_bytes(cfg: dict, modelslim: dict | None = None, path: str | None = None) -> tuple[float, str]:
    """Bytes per weight of the linear layers outside the routed experts, and their format: the
    checkpoint's quantisation priced as for an expert's shape, without ``expert_dtype`` (DeepSeek-V4's
    MXFP4 is the routed experts' alone)."""
    hidden, inter = _expert_shape(ConfigFields(cfg, path))
    size, fmt = expert_bytes({k: v for k, v in cfg.items() if k != "expert_dtype"}, modelslim, path)
    return size / (3 * hidden * inter), fmt


def model_dtype_bytes(cfg: dict, path: str | None = None) -> int:
    """Bytes of one value in the model dtype (``torch_dtype``), the unquantised weights' format."""
    try:
        return _dtype_bytes(_model_dtype(ConfigFields(cfg, path)), "config torch_dtype")
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, path) from None


def kv_bytes_per_token(model: ModelFiles, kv_cache_dtype: str = "auto") -> tuple[int, int, str]:
    """One token's KV cache over all layers on one rank (attention TP 1), what a sequence holds
    whatever its length (DeepSeek-V4's window and compressor states) and its format."""
    f, path = model.fields(), model.where
    if v4_compress_ratios(f) is not None:
        shape = model.attention()
        assert isinstance(shape, V4Shape)  # the V4 ratios give a V4 shape
        cache = v4_cache(shape, model.cfg, kv_cache_dtype, path)
        return cache.per_token, cache.per_sequence, cache.describe()
    dtype = _model_dtype(f) if kv_cache_dtype == "auto" else kv_cache_dtype
    size = _dtype_bytes(dtype, "kv cache dtype")
    layers = f.integer("num_hidden_layers", 1)
    if f.has("kv_lora_rank"):
        rank, rope = f.integer("kv_lora_rank", 1), f.integer("qk_rope_head_dim", 0, default=0)
        return layers * (rank + rope) * size, 0, f"MLA latent {rank} + rope {rope} per layer, {dtype}"
    heads = f.integer("num_attention_heads", 1)
    kv_heads = f.integer("num_key_value_heads", 1, default=heads)
    head_dim = f.integer("head_dim", 1, default=None) or f.integer("hidden_size", 1) // heads
    if head_dim < 1:
        raise SceneEplbError(f"config hidden_size {f.cfg['hidden_size']} is smaller than num_attention_heads {heads}", path)
    return layers * 2 * kv_heads * head_dim * size, 0, f"K and V, {kv_heads} KV heads x {head_dim} per layer, {dtype}"


def read_model_memory(model: ModelFiles, kv_cache_dtype: str = "auto", expert_bytes_override: int | None = None) -> ModelMemory:
    """Price a model's expert and KV token (see the module docstring)."""
    path = model.where
    try:
        if expert_bytes_override is not None:
            if expert_bytes_override <= 0:
                raise SceneEplbError(f"--expert-bytes must be positive, got {expert_bytes_override}")
            per_expert, fmt = expert_bytes_override, "given (--expert-bytes)"
        else:
            per_expert, fmt = expert_bytes(model.cfg, model.modelslim, path)
        kv, per_sequence, kv_fmt = kv_bytes_per_token(model, kv_cache_dtype)
    except SceneEplbError as exc:
        raise SceneEplbError(exc.problem, path) from None
    return ModelMemory(per_expert, fmt, kv, kv_fmt, len(model.geometry.moe_layers), per_sequence)


def replica_cost(memory: ModelMemory, slots_per_rank: float, drafter_layers: int = 0) -> dict:
    """What ``slots_per_rank`` redundant slots per rank in every MoE layer cost each rank (the
    ``memory`` object of ``--json``): the model's prices, their bytes over all MoE layers (and a
    speculative drafter's ``drafter_layers``, which vLLM builds with the same slots), and the KV
    tokens those bytes would have held."""
    redundant = round(slots_per_rank * (memory.num_moe_layers + drafter_layers) * memory.bytes_per_expert)
    return {
        **asdict(memory),
        "drafter_moe_layers": drafter_layers,
        "redundant_slots_per_rank_per_layer": slots_per_rank,
        "redundant_bytes_per_rank": redundant,
        "kv_tokens_per_rank": redundant // memory.kv_bytes_per_token if memory.kv_bytes_per_token else None,
    }


def geometry_cost(memory: ModelMemory, geometry: Geometry, drafter_layers: int = 0) -> dict:
    """``replica_cost`` of a geometry: R / ep_size redundant slots per rank (an average when ep_size
    does not divide R)."""
    return replica_cost(memory, geometry.num_redundant / geometry.ep_size, drafter_layers)


def cost_sentence(cost: dict, geometry: Geometry | None = None) -> str:
    """The replica cost in one sentence a capacity planner can act on (``geometry`` names R and ep;
    without it, the price of one redundant slot per rank)."""
    slots = cost["redundant_slots_per_rank_per_layer"]
    drafter = cost.get("drafter_moe_layers") or 0
    layers = f"{cost['num_moe_layers']} MoE layers" + (f" and the drafter's {drafter}" if drafter else "")
    if slots == 0:
        return "No redundant slots: the layout costs no memory beyond the model's own experts."
    if geometry is None:
        what = f"One redundant slot per rank in each of {layers} costs"
    else:
        what = (
            f"{geometry.num_redundant} redundant slots on {geometry.ep_size} ranks put {slots:g} extra expert"
            f"{'' if slots == 1 else 's'} per rank in each of {layers}:"
        )
    return (
        f"{what} {cost['redundant_bytes_per_rank'] / GIB:.2f} GiB of expert weights per rank "
        f"({cost['bytes_per_expert'] / 2**20:.1f} MiB per expert, {cost['expert_format']}), memory that would hold "
        f"{cost['kv_tokens_per_rank']:,} tokens of KV cache per rank ({cost['kv_bytes_per_token']:,} B per token, {cost['kv_format']})."
    )


def memory_cost(memory: ModelMemory | None, geometry: Geometry | None, drafter_layers: int = 0) -> dict | None:
    """The ``memory`` object of ``--json`` (``replica_cost`` with its ``summary`` sentence), None without
    a model: for the geometry's redundant slots, or per redundant slot per rank without a geometry."""
    if memory is None:
        return None
    cost = geometry_cost(memory, geometry, drafter_layers) if geometry else replica_cost(memory, 1.0, drafter_layers)
    return {**cost, "summary": cost_sentence(cost, geometry)}
