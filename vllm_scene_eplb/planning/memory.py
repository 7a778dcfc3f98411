"""What redundant expert slots cost in device memory, and how much KV cache that memory would hold.

Every redundant slot holds a full copy of one routed expert's weights in every MoE layer, on the
rank that gets it: memory that comes out of that rank's KV cache. From a Hugging Face model folder
(``config.json`` and its ``quantization_config``, or without one vLLM-Ascend's ModelSlim
``quant_model_description.json``: ``checkpoint_quantization``) this module prices one expert and one
token of KV cache:

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
from collections import Counter
from dataclasses import asdict, dataclass
from fractions import Fraction

from ..errors import SceneEplbError
from ..layouts.layout import Geometry
from .model_files import ModelFiles
from .model_geometry import ConfigFields, V4Shape, v4_compress_ratios

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}
KV_CACHE_DTYPES = ("auto",) + tuple(DTYPE_BYTES)
ASCEND_QUANTIZATION = "ascend"  # the --quantization that reads a ModelSlim description
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


# vLLM-Ascend 0.23.0.post1's V4 pages on A3 (models/layer/attention/layer.py, get_dsv4_block_sizes): per
# --block-size, the entries a block holds of [compressed MLA, SWA, ratio-4 state, ratio-128 state], and the
# two page sizes compressor states pad to [t1, t2]
ASCEND_V4_BLOCKS = {
    128: ((128, 128, 8, 32), (16640, 131072)),
    64: ((64, 64, 4, 16), (8320, 65536)),
    32: ((32, 32, 2, 8), (4160, 32768)),
}
BF16_BYTES, FLOAT16_BYTES = 2, 2


def _approximate_gcd(values: list[int], lower_bound: int) -> int:
    """vLLM 0.23's ``kv_cache_utils._approximate_gcd``: the chunk in [lower_bound, max] that pads the
    values up to its multiples least (ties: the larger)."""
    best, best_pad = lower_bound, None
    for d in range(lower_bound, max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


@dataclass(frozen=True)
class Window:
    """A KV cache group of sliding-window pages (vLLM's ``SlidingWindowManager``): ``groups`` groups of
    ``block`` tokens a page, keeping the last ``window`` tokens of each sequence."""

    name: str
    block: int
    window: int
    groups: int

    @property
    def per_sequence(self) -> int:
        """Blocks a sequence holds whatever its length: the window and the next token, at any alignment."""
        return self.groups * (-(-(self.window - 1) // self.block) + 1)


@dataclass(frozen=True)
class AscendV4Cache:
    """One rank's DeepSeek-V4 cache as vLLM-Ascend 0.23.0.post1 lays it out on A3 (attention DP):

    - pages (``models/deepseek_v4.py``, ``models/layer/attention/layer.py``): a ratio-r layer's compressed
      entries, ``head_dim`` at the KV dtype, a block of 128 entries (r x 128 tokens); a ratio-4 layer's
      indexer keys, int8 with one float16 scale at ``index_head_dim`` 128 (16,640 B a block); every layer's
      window, bfloat16 (``AscendDeepseekV4SWACache``); the compressors' float32 states (kv and score,
      ``2 x coff x head_dim``) in blocks of 8 (ratio 4) or 32 (ratio 128) tokens, each page padded to 16,640
      or 131,072 B (``AscendCompressorStateCache``);
    - tensors (``patch/platform/patch_kv_cache_utils.py``): the compressed layers grouped by ratio, the
      windowed ones by block size and split into groups of ``tuples`` layers (``_approximate_gcd``); every
      block id owns one page of each page size in each of ``tuples`` layer tuples, the MTP layer's its own
      (``_get_kv_cache_config_deepseek_v4``), so every block of every group costs ``block_bytes``;
    - blocks a sequence takes: ``cdiv(tokens // r, 128)`` of each compressed group (``CompressAttentionManager``),
      each windowed group its window (``SlidingWindowManager``), and during a step a page per ``block`` of
      its in-flight tokens in every windowed group."""

    shape: V4Shape
    block_size: int  # the server's --block-size (vLLM-Ascend's V4 tables know 128, 64 and 32)
    entry_bytes: int  # a compressed entry: head_dim at the KV dtype
    dtype: str
    mtp_layers: int  # the drafter's layers (window only), with speculative decoding on

    def _layout(self) -> tuple[tuple[int, ...], int, tuple[Window, ...]]:
        """The full-MLA group's page sizes, the layer tuples per block id and the windowed groups."""
        s = self.shape
        (mla, swa, c4_state, c128_state), pads = ASCEND_V4_BLOCKS[self.block_size]
        at4, at128 = s.layers_at(4), s.layers_at(128)
        if not at4 or not at128:
            raise SceneEplbError("vLLM-Ascend's V4 cache layout needs layers at compress ratio 4 and 128")
        index_page = mla * (s.index_head_dim + (FLOAT16_BYTES if s.index_head_dim == 128 else 0))
        mla_sizes = sorted({mla * self.entry_bytes, index_page})

        def bucket(page: int) -> int:  # a windowed page padded up to the next full-MLA page size
            if page > mla_sizes[-1]:
                raise SceneEplbError(f"a {page} B window page exceeds the largest compressed page ({mla_sizes[-1]} B)")
            return min(x for x in mla_sizes if x >= page)

        def state(state_dim: int, ratio: int, block: int) -> int:  # AscendCompressorStateCache's padded page
            real, pad = block * state_dim * FLOAT32_BYTES, pads[0] if state_dim == 512 and ratio == 4 else pads[1]
            if real > pad:
                raise SceneEplbError(f"a compressor state page of {real} B exceeds vLLM-Ascend's padded {pad} B")
            return bucket(pad)

        windowed = {  # block -> (window, layers per page size)
            swa: (s.window, Counter({bucket(swa * s.head_dim * BF16_BYTES): s.layers + self.mtp_layers})),
            c4_state: (
                s.overlap(4) * 4,
                Counter({state(2 * 2 * s.head_dim, 4, c4_state): at4})
                + Counter({state(2 * 2 * s.index_head_dim, 4, c4_state): at4}),
            ),
            c128_state: (128, Counter({state(2 * s.head_dim, 128, c128_state): at128})),
        }
        mla_counts = Counter({mla * self.entry_bytes: at4}) + Counter({index_page: at4})
        values = [max(mla_counts.values()), at128, *(max(sizes.values()) for _, sizes in windowed.values())]
        tuples = _approximate_gcd(values, values[0])
        buckets = [at4, at128]
        groups = []
        for (block, (window, sizes)), name in zip(windowed.items(), ("window", "ratio-4 state", "ratio-128 state")):
            n = max(sizes.values())
            split = -(-n // tuples)
            groups.append(Window(name, block, window, split))
            share = [len(range(i, n, split)) for i in range(split)]  # layer_tuples[i::split]
            if name == "window":  # the MTP layers, registered last, leave their buckets for tensors of their own
                for layer in range(n - self.mtp_layers, n):
                    share[layer % split] -= 1
            buckets += share
        return tuple(mla_sizes), max(buckets) + self.mtp_layers, tuple(groups)

    @property
    def block_bytes(self) -> int:
        """What one block id holds in every layer tuple (``num_blocks`` divides the cache by it)."""
        sizes, tuples, _ = self._layout()
        return sum(sizes) * tuples

    @property
    def windows(self) -> tuple[Window, ...]:
        return self._layout()[2]

    @property
    def tokens_per_block(self) -> Fraction:
        """Tokens of context a block of the compressed groups covers, both ratios together."""
        mla = ASCEND_V4_BLOCKS[self.block_size][0][0]
        return 1 / (Fraction(1, 4 * mla) + Fraction(1, 128 * mla))

    @property
    def per_token(self) -> int:
        return math.ceil(self.block_bytes / self.tokens_per_block)

    @property
    def per_sequence(self) -> int:
        """A sequence's windows and the compressed groups' last, partial blocks."""
        return self.block_bytes * (2 + sum(w.per_sequence for w in self.windows))

    def step_bytes(self, tokens: int) -> int:
        """The windowed groups' pages of a step's ``tokens`` in-flight tokens."""
        return math.ceil(self.block_bytes * sum(Fraction(w.groups * tokens, w.block) for w in self.windows))

    def describe(self) -> str:
        sizes, tuples, groups = self._layout()
        return (
            f"DeepSeek-V4 in vLLM-Ascend's pages, block size {self.block_size}: {tuples} layer tuples x "
            f"({' + '.join(f'{x:,}' for x in sizes)}) B a block of {float(self.tokens_per_block):.0f} tokens, "
            f"{sum(w.groups for w in groups)} windowed groups"
        )


def ascend_v4_cache(
    shape: V4Shape, cfg: dict, block_size: int, mtp_layers: int, kv_cache_dtype: str = "auto", path: str | None = None
) -> AscendV4Cache:
    """DeepSeek-V4's cache as vLLM-Ascend lays it out (``AscendV4Cache``) at ``kv_cache_dtype``."""
    if block_size not in ASCEND_V4_BLOCKS:
        raise SceneEplbError(
            f"vLLM-Ascend's DeepSeek-V4 takes --block-size {', '.join(map(str, ASCEND_V4_BLOCKS))}, not {block_size}"
        )
    base = v4_cache(shape, cfg, kv_cache_dtype, path)
    return AscendV4Cache(shape, block_size, base.entry_bytes, base.dtype, mtp_layers)


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


MODELSLIM_INT8 = ("W8A8", "W8A8_DYNAMIC")  # ModelSlim's int8 kinds: a scale and an offset per output row


@dataclass(frozen=True)
class LinearFormat:
    """How a checkpoint stores a linear weight: ModelSlim's int8 (``W8A8`` / ``W8A8_DYNAMIC``) with a
    scale and an offset per output row in the model dtype, fp8 with a scale per block (or per tensor),
    or the model dtype (``FLOAT``)."""

    kind: str  # a ModelSlim kind, "fp8" or "FLOAT"
    dtype_bytes: int  # the model dtype's
    block: tuple[int, int] | None = None  # fp8's scale block (None: one scale per tensor)
    scale_bytes: int = 4  # fp8's scale: float32, or ue8m0 (a byte)
    describe: str = ""

    def bytes(self, rows: int, cols: int) -> int:
        """Bytes of a [rows, cols] weight, its scales included."""
        if self.kind in MODELSLIM_INT8:
            return rows * cols + 2 * rows * self.dtype_bytes
        if self.kind == "fp8":
            return rows * cols + self.scale_bytes * (_blocks(rows, cols, self.block) if self.block else 1)
        return rows * cols * self.dtype_bytes


def linear_format(cfg: dict, modelslim: dict | None, path: str | None = None, contains: str = ".experts.") -> LinearFormat:
    """How the checkpoint stores its linear weights (``checkpoint_quantization``): with ModelSlim's
    description, the kind of the first weight whose name holds ``contains`` (FLOAT without one); with
    an fp8 ``quantization_config``, its block and scale format; else the model dtype."""
    f = ConfigFields(cfg, path)
    dtype = _model_dtype(f)
    size = _dtype_bytes(dtype, "torch_dtype")
    method = checkpoint_quantization(cfg, modelslim, path)
    if method is None:
        return LinearFormat("FLOAT", size, describe=dtype)
    if method == ASCEND_QUANTIZATION:
        kind = next((v for k, v in (modelslim or {}).items() if contains in k and k.endswith(".weight")), "FLOAT")
        if kind == "FLOAT":
            return LinearFormat(kind, size, describe=f"{dtype} (ModelSlim FLOAT)")
        if kind in MODELSLIM_INT8:
            return LinearFormat(kind, size, describe=f"{kind} (ModelSlim: int8, per-channel scale and offset)")
        raise SceneEplbError(f"ModelSlim quantisation {kind!r} is not priced here: pass --expert-bytes")
    if method != "fp8":
        raise SceneEplbError(f"quantization method {method!r} is not priced here: pass --expert-bytes")
    quant = f.obj("quantization_config") or {}
    block = quant.get("weight_block_size")
    if not block:
        return LinearFormat("fp8", size, describe="fp8 with per-tensor scales")
    if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b >= 1 for b in block)):
        raise SceneEplbError(f"config quantization_config.weight_block_size must be two integers >= 1, got {block!r}", path)
    ue8m0 = ConfigFields(quant, path).text("scale_fmt", "") == "ue8m0"  # DeepSeek-V3's: float32; V4's ue8m0, a byte
    describe = f"fp8 with {block[0]}x{block[1]} {'ue8m0 ' if ue8m0 else ''}block scales"
    return LinearFormat("fp8", size, (block[0], block[1]), 1 if ue8m0 else 4, describe)


def expert_bytes(cfg: dict, modelslim: dict | None = None, path: str | None = None) -> tuple[int, str]:
    """Bytes of one routed expert in one MoE layer (gate, up and down in the checkpoint's format:
    ``linear_format``), and how they were priced."""
    f = ConfigFields(cfg, path)
    hidden, inter = _expert_shape(f)
    experts = f.text("expert_dtype", "") if f.obj("quantization_config") else ""  # vLLM reads it only through its quant config
    if experts == "fp4":  # DeepSeek-V4's MXFP4 experts: two weights per byte, one ue8m0 scale per 32
        params = 3 * hidden * inter
        return params // 2 + params // 32, "MXFP4 (expert_dtype fp4: 4-bit weights, a ue8m0 scale per 32)"
    if experts not in ("", "fp8"):
        raise SceneEplbError(f"config expert_dtype {experts!r} is not priced here: pass --expert-bytes", path)
    fmt = linear_format(cfg, modelslim, path)
    return 2 * fmt.bytes(inter, hidden) + fmt.bytes(hidden, inter), fmt.describe


def checkpoint_quantization(cfg: dict, modelslim: dict | None, path: str | None = None) -> str | None:
    """The quantisation a server reads from the checkpoint, in ``--quantization``'s names: the config's
    ``quantization_config.quant_method`` where it names one (vLLM 0.23's ``ModelConfig._verify_quantization``
    takes it, and refuses any other ``--quantization``), else ``ascend`` where ModelSlim's description lies
    beside the config (vLLM-Ascend's ``AscendModelSlimConfig``, which ``--quantization ascend`` needs), else
    None (unquantised)."""
    quant = ConfigFields(cfg, path).obj("quantization_config")
    method = ConfigFields(quant, path).text("quant_method", "") if quant else ""
    return method or (ASCEND_QUANTIZATION if modelslim is not None else None)


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
