"""Does a server's recipe fit its devices? One rank's weights, communication buffer and KV cache,
for DeepSeek-V3's MLA (``MlaModel``) or DeepSeek-V4's compressed sparse attention (``V4Model``), on
the engine that serves it (``Recipe.engine``: vLLM, or vLLM-Ascend 0.23.0.post1, which keeps more).

Built on ``memory`` (one routed expert's bytes, one KV token's bytes, the checkpoint's linear format)
and the model's config.json, per rank of a DP x TP server with expert parallelism over all DP x TP
ranks (EP = DP x TP):

- **routed weights**: the layout's slots per rank (E + R) / EP in every MoE layer, each one routed
  expert (``memory.expert_bytes``, scales included);
- **non-routed weights**: embedding and LM head (vocab-parallel: 1 / TP), per layer MLA attention
  (``q_a_proj`` and ``kv_a_proj_with_mqa`` replicated, ``q_b_proj``, ``kv_b_proj`` and ``o_proj``
  1 / TP, as vLLM's DeepSeek model shards them), the dense layers' MLP and the shared experts (1 / TP;
  replicated on vLLM-Ascend under FlashComm1 or shared-expert DP: ``ops/linear_op.py``'s
  ``get_parallel_op`` gives a ``shared_experts`` linear TP 1 where ``shared_expert_dp_enabled()``) and
  the router gate (replicated, model dtype); linear layers in the checkpoint's format
  (``memory.linear_format``: ModelSlim's int8 with a scale and offset per row, fp8 with block
  scales, or the model dtype). Norms and biases (a few MB) are left out;
- **what the engine keeps beside the weights** (``copies``, each named): MLA's absorbed ``W_UV`` /
  ``W_UK_T`` (``kv_b_proj`` split and transposed, model dtype, 1 / TP: vLLM's ``mla_attention.py``
  and vLLM-Ascend's ``mla_v1.py`` both keep them); on vLLM-Ascend only: on a kv_consumer with W8A8
  attention, MLAPO's fused q_a/kv_a/q_b weights beside the originals, which it drops only at
  ``max_num_batched_tokens`` <= 1024; with its dynamic EPLB (``NATIVE_EPLB=1``) its swap buffer, one
  layer's local expert slots; with MTP (``num_speculative_tokens``) the drafter's layer: a MoE layer at
  the same slots per rank (vLLM-Ascend's default split) and its ``eh_proj`` (embedding and head are
  shared), and its latent in every KV token;
- **MC2 buffer** (vLLM-Ascend only): its MC2 capacity per TP rank (``set_mc2_tokens_capacity``: the
  batched tokens with prefill MC2, else the largest graph size, else max_num_seqs x the decode query
  length (1 + speculative tokens); capped at 512), the largest graph as vLLM-Ascend sets its default
  (``platform.py``, ``_get_default_max_cudagraph_capture_size``: max_num_seqs x the decode query length
  up to 512) and vLLM caps it (``config/vllm.py``: at most ``max_num_batched_tokens``), priced with CANN's
  ``npu_moe_distribute_dispatch`` rule for A3, ``HCCL_BUFFSIZE >= 2 x (local experts x maxBs x EP x
  Align512(Align32(2H) + 64) + (top-k + shared) x maxBs x Align512(2H))`` bytes; the MC2 communicator
  holds 2 x HCCL_BUFFSIZE. On vLLM the MoE all-to-all buffers are not priced;
- **reserve**: activations, graphs and the other communicators, an estimate the operator sets;
- **KV cache**: what is left of ``gpu_memory_utilization`` x device memory, in tokens of
  ``memory.kv_bytes_per_token`` (MLA keeps the full latent on every TP rank).

**DeepSeek-V4** (``V4Model``): per layer its attention by compress ratio as vLLM builds it
(``V4Shape.attention_linears``: wq_a/wkv, the compressors and the indexer replicated, wq_b and wo_a
1 / TP, wo_b 1 / TP; the compressors and weights_proj unquantised; on vLLM-Ascend ``wq_b`` replicated
under DSA-CP: ``models/deepseek_v4.py`` builds it ``ReplicatedLinear if self.enable_dsa_cp``), the
hyper-connections' float32 mixing weights, shared expert and gate on every layer (all MoE), the hash
layers' token -> expert tables (int32); no MLA copies (no kv_b to absorb, no MLAPO). Its cache on vLLM
(``memory.V4Cache``): per token the compressed entries and indexer keys; beside them, windows and
compressor states for each of ``max_num_seqs`` sequences and for the step's ``max_num_batched_tokens``
in-flight tokens (vLLM's sliding-window admission); the MTP layer is window-only attention (vLLM builds
it at ratio 1). On vLLM-Ascend its padded pages (``memory.AscendV4Cache``): every block of every KV
cache group costs one block id's pages in all layer tuples.

The recipe fits when the KV cache holds ``max_num_seqs`` sequences of ``max_model_len`` tokens (so
no admitted sequence is preempted for KV; vLLM itself refuses below one), the ``shared_prefix``
tokens every sequence starts with held once (prefix caching keeps them), and HCCL_BUFFSIZE, where
set, covers the MC2 buffer. Arithmetic from the config, not measured on a device. Pure, no engine.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import SceneEplbError
from .memory import (
    FLOAT32_BYTES,
    GIB,
    MODELSLIM_INT8,
    AscendV4Cache,
    LinearFormat,
    ModelMemory,
    V4Cache,
    ascend_v4_cache,
    linear_format,
    model_dtype_bytes,
    v4_cache,
)
from .model_geometry import ConfigFields, Linear, MlaShape, V4Shape, attention_shape, from_hf_config

MIB = 1024**2
MC2_TOKEN_CAP = 512  # vLLM-Ascend caps the MC2 tokens per TP rank here (set_mc2_tokens_capacity)
GRAPH_CAP = 512  # and its default largest graph (_get_default_max_cudagraph_capture_size)
HCCL_DEFAULT_MB = 200  # CANN's (and vLLM-Ascend's) default HCCL_BUFFSIZE
MLAPO_MAX_TOKENS = 1024  # vLLM-Ascend's MLAPO_MAX_SUPPORTED_TOKENS: at or below it a kv_consumer drops the originals
VLLM, VLLM_ASCEND = "vllm", "vllm-ascend"
ENGINES = (VLLM_ASCEND, VLLM)
ENGINE_NAMES = {VLLM_ASCEND: "vLLM-Ascend", VLLM: "vLLM"}


@dataclass(frozen=True)
class Recipe:
    """What a server's command line and node set that decides its memory per rank."""

    dp: int
    tp: int
    slots_per_rank: int  # physical expert slots per rank in each MoE layer: (E + R) / (DP x TP)
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    device_bytes: int  # one device's (die's) memory
    reserve_bytes: int  # activations, graphs, other communicators (an estimate)
    graphs: bool = True  # ACL graphs (not --enforce-eager): the MC2 capacity follows the largest graph
    prefill_mc2: bool = False  # vLLM-Ascend's enable_prefill_mc2
    hccl_buffsize_mb: int | None = None  # HCCL_BUFFSIZE where the operator set it
    kv_consumer: bool = False  # a D server (kv_role kv_consumer): MLAPO runs there
    native_eplb: bool = False  # vLLM-Ascend's dynamic EPLB on (NATIVE_EPLB=1): its swap buffer
    speculative_tokens: int = 0  # MTP drafts per step (num_speculative_tokens): the drafter's layer
    engine: str = VLLM_ASCEND  # the engine serving it: vLLM-Ascend keeps more (module docstring)
    flashcomm1: bool = False  # vLLM-Ascend's VLLM_ASCEND_ENABLE_FLASHCOMM1=1 (its sequence parallelism)
    dsa_cp: bool = False  # vLLM-Ascend's enable_dsa_cp (needs sequence parallelism)
    shared_expert_dp: bool = False  # vLLM-Ascend's enable_shared_expert_dp (turns sequence parallelism on)
    block_size: int = 128  # --block-size: vLLM-Ascend's V4 pages follow it
    shared_prefix: int = 0  # tokens every sequence starts with, held once by the prefix cache

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise SceneEplbError(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        ascend_only = {
            "prefill MC2": self.prefill_mc2,
            "HCCL_BUFFSIZE": self.hccl_buffsize_mb is not None,
            "native EPLB": self.native_eplb,
            "FlashComm1": self.flashcomm1,
            "DSA-CP": self.dsa_cp,
            "shared-expert DP": self.shared_expert_dp,
        }
        named = [name for name, on in ascend_only.items() if on]
        if named and self.engine != VLLM_ASCEND:
            raise SceneEplbError(
                f"{', '.join(named)} {'is' if len(named) == 1 else 'are'} vLLM-Ascend's: the recipe is for {self.engine}"
            )
        if self.dsa_cp and not self.sequence_parallel:
            raise SceneEplbError("DSA-CP needs FlashComm1 or shared-expert DP (vLLM-Ascend: 'DSA CP requires SP to be enabled')")
        if not 0 <= self.shared_prefix < self.max_model_len:
            raise SceneEplbError(
                f"a shared prefix of {self.shared_prefix:,} tokens leaves nothing of max_model_len {self.max_model_len:,}"
            )

    @property
    def ascend(self) -> bool:
        return self.engine == VLLM_ASCEND

    @property
    def sequence_parallel(self) -> bool:
        """vLLM-Ascend's ``enable_sp()``: FlashComm1, or shared-expert DP, which turns it on."""
        return self.ascend and (self.flashcomm1 or self.shared_expert_dp)

    @property
    def shared_tp(self) -> int:
        """The TP the shared experts are split over: 1 where vLLM-Ascend's ``shared_expert_dp_enabled()``
        (shared-expert DP or sequence parallelism) replicates them."""
        return 1 if self.sequence_parallel else self.tp


@dataclass(frozen=True)
class RankSizing:
    """One rank's memory under a recipe (bytes) and whether it fits (``problems`` empty)."""

    non_routed_bytes: int
    routed_bytes: int
    hccl_bytes: int
    reserve_bytes: int
    budget_bytes: int  # gpu_memory_utilization x device memory
    kv_bytes: int  # what is left for the KV cache (negative: the weights alone do not fit)
    kv_bytes_per_token: int
    kv_tokens: int
    max_model_len_fit: int  # the longest sequence the KV cache holds (one sequence)
    max_num_seqs_fit: int  # sequences of max_model_len tokens it holds at once (the shared prefix held once)
    mc2_tokens_per_rank: int  # 0: no MC2 (vLLM)
    hccl_buffsize_mb: int  # the HCCL_BUFFSIZE this recipe needs (at least CANN's default; 0 on vLLM)
    problems: tuple[str, ...]
    copies: tuple[tuple[str, int], ...] = ()  # what the engine keeps beside the weights, by name (bytes)
    kv_bytes_per_sequence: int = 0  # DeepSeek-V4's window and compressor states (with the MTP layer's window)
    kv_state_bytes: int = 0  # all of them: max_num_seqs sequences' and the step's in-flight tokens'
    kv_format: str = ""  # how the cache was priced

    def to_dict(self) -> dict:
        return {**asdict(self), "problems": list(self.problems), "copies": dict(self.copies)}


def _align(x: int, to: int) -> int:
    return -(-x // to) * to


def _split(fmt: LinearFormat, rows: int, cols: int, tp: int, row_parallel: bool = False) -> int:
    """A [rows, cols] weight's bytes on one of ``tp`` ranks: a column-parallel layer keeps 1 / TP of its
    output rows (and their scales), a row-parallel one 1 / TP of its input columns and every row's scales."""
    return fmt.bytes(rows, -(-cols // tp)) if row_parallel else fmt.bytes(-(-rows // tp), cols)


@dataclass(frozen=True)
class MlaModel:
    """The config's numbers the preflight prices (DeepSeek's MLA model), its dtype's bytes and the
    checkpoint's format of its attention."""

    dtype_bytes: int
    attn: LinearFormat
    hidden: int
    vocab: int
    layers: int
    heads: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v_dim: int

    @classmethod
    def of(cls, m: MlaShape, cfg: dict, modelslim: dict | None, path: str | None = None) -> MlaModel:
        attn = linear_format(cfg, modelslim, path, "self_attn.")
        dtype = model_dtype_bytes(cfg, path)
        return cls(dtype, attn, m.hidden, m.vocab, m.layers, m.heads, m.q_lora, m.kv_lora, m.qk_nope, m.qk_rope, m.v_head)

    def non_routed(self, cfg: dict, modelslim: dict | None, recipe: Recipe, path: str | None) -> int:
        """One rank's weights outside the routed experts (module docstring)."""
        f, hidden, tp = ConfigFields(cfg, path), self.hidden, recipe.tp
        dense, inter = f.integer("first_k_dense_replace", 0, default=0), f.integer("intermediate_size", 1)
        mlp = linear_format(cfg, modelslim, path, "mlp.gate_proj")
        dense_mlp = dense * (2 * _split(mlp, inter, hidden, tp) + _split(mlp, hidden, inter, tp, row_parallel=True))
        moe_rest = (self.layers - dense) * _moe_layer_rest(cfg, modelslim, self, recipe.shared_tp, path)
        embed_and_head = 2 * math.ceil(self.vocab / tp) * hidden * self.dtype_bytes
        return self.layers * self.attention(tp) + dense_mlp + moe_rest + embed_and_head

    def copies(self, recipe: Recipe) -> list[tuple[str, int]]:
        """What MLA keeps beside the weights: the absorbed W_UV/W_UK_T (both engines), and on vLLM-Ascend
        MLAPO's fused weights on a W8A8 kv_consumer above its token limit."""
        copies = [("absorbed MLA W_UV/W_UK_T", self.layers * self.absorbed(recipe.tp))]
        mlapo = recipe.kv_consumer and self.attn.kind in MODELSLIM_INT8 and recipe.max_num_batched_tokens > MLAPO_MAX_TOKENS
        if recipe.ascend and mlapo:
            kept = self.q_kv_a() + self.q_b(recipe.tp)
            copies.append((f"MLAPO's q_a/kv_a/q_b kept (max_num_batched_tokens > {MLAPO_MAX_TOKENS})", self.layers * kept))
        return copies

    def mtp_layer(self, cfg: dict, modelslim: dict | None, recipe: Recipe, path: str | None) -> int:
        """The MTP drafter's layer outside its routed experts: MLA, shared experts, gate and ``eh_proj``."""
        eh_proj = 2 * self.hidden * self.hidden * self.dtype_bytes
        return self.attention(recipe.tp) + _moe_layer_rest(cfg, modelslim, self, recipe.shared_tp, path) + eh_proj

    def cache(self, memory: ModelMemory, recipe: Recipe) -> tuple[int, int, int, str]:
        """The cache's bytes per token, per sequence and of the step's in-flight tokens, and its format:
        one latent per layer per token, the MTP layer's too; MLA has no window."""
        mtp = memory.kv_bytes_per_token // self.layers if recipe.speculative_tokens else 0
        return memory.kv_bytes_per_token + mtp, 0, 0, memory.kv_format

    def q_kv_a(self) -> int:
        """``q_a_proj`` and ``kv_a_proj_with_mqa``: replicated on every TP rank."""
        return self.attn.bytes(self.q_lora, self.hidden) + self.attn.bytes(self.kv_lora + self.rope, self.hidden)

    def q_b(self, tp: int) -> int:
        """``q_b_proj`` on a rank (column-parallel)."""
        return _split(self.attn, self.heads * (self.nope + self.rope), self.q_lora, tp)

    def attention(self, tp: int) -> int:
        """One layer's MLA attention on a rank: q_a and kv_a replicated, q_b and kv_b column-parallel,
        o_proj row-parallel."""
        kv_b = _split(self.attn, self.heads * (self.nope + self.v_dim), self.kv_lora, tp)
        o_proj = _split(self.attn, self.hidden, self.heads * self.v_dim, tp, row_parallel=True)
        return self.q_kv_a() + self.q_b(tp) + kv_b + o_proj

    def absorbed(self, tp: int) -> int:
        """One layer's ``W_UV`` and ``W_UK_T`` (``kv_b_proj`` dequantised to the model dtype), 1 / TP."""
        return math.ceil(self.kv_lora * self.heads * (self.nope + self.v_dim) * self.dtype_bytes / tp)


@dataclass(frozen=True)
class V4Model:
    """DeepSeek-V4's numbers the preflight prices (``V4Shape``), its dtype's bytes, the checkpoint's
    format of its attention and its cache's pricing on vLLM (``V4Cache``)."""

    dtype_bytes: int
    attn: LinearFormat
    shape: V4Shape
    vllm_cache: V4Cache
    hash_layers: int
    top_k: int

    @classmethod
    def of(cls, shape: V4Shape, cfg: dict, modelslim: dict | None, path: str | None, kv_cache_dtype: str = "auto") -> V4Model:
        geometry = from_hf_config(cfg, path)
        return cls(
            model_dtype_bytes(cfg, path),
            linear_format(cfg, modelslim, path, "attn."),
            shape,
            v4_cache(shape, cfg, kv_cache_dtype, path),
            len(geometry.hash_layers),
            geometry.top_k or 0,
        )

    @property
    def hidden(self) -> int:
        return self.shape.hidden

    @property
    def layers(self) -> int:
        return self.shape.layers

    def _bytes(self, linear: Linear, recipe: Recipe) -> int:
        fmt = self.attn if linear.quantized else LinearFormat("FLOAT", self.dtype_bytes)
        replicated = linear.name == "wq_b" and recipe.ascend and recipe.dsa_cp  # ReplicatedLinear under DSA-CP
        tp = recipe.tp if linear.sharded and not replicated else 1
        return _split(fmt, linear.rows, linear.cols, tp, linear.row_parallel)

    def attention(self, ratio: int, recipe: Recipe) -> int:
        """One layer's attention at compress ratio ``ratio`` on a rank (``V4Shape.attention_linears``)."""
        return sum(self._bytes(x, recipe) for x in self.shape.attention_linears(ratio))

    def hyper_connections(self) -> int:
        """One layer's hyper-connection weights (float32, replicated)."""
        return self.shape.hc_weights * FLOAT32_BYTES

    def non_routed(self, cfg: dict, modelslim: dict | None, recipe: Recipe, path: str | None) -> int:
        """One rank's weights outside the routed experts: every layer's attention by its compress ratio
        and hyper-connections, the MoE layers' shared experts and gate, the hash layers' token -> expert
        tables (int32, vocab x top-k), embedding and LM head (1 / TP) and the head's hyper-connection."""
        s = self.shape
        attention = sum(self.attention(r, recipe) for r in s.compress_ratios)
        moe_rest = s.layers * _moe_layer_rest(cfg, modelslim, self, recipe.shared_tp, path)
        tables = self.hash_layers * s.vocab * self.top_k * 4
        head = s.hc_mult * s.hc_mult * s.hidden * FLOAT32_BYTES
        embed_and_head = 2 * math.ceil(s.vocab / recipe.tp) * s.hidden * self.dtype_bytes
        return attention + s.layers * self.hyper_connections() + moe_rest + tables + embed_and_head + head

    def copies(self, recipe: Recipe) -> list[tuple[str, int]]:
        """No MLA absorbed weights nor MLAPO: V4 has no kv_b to absorb (other copies vLLM-Ascend's V4
        may keep are not priced)."""
        return []

    def mtp_layer(self, cfg: dict, modelslim: dict | None, recipe: Recipe, path: str | None) -> int:
        """The MTP drafter's layer outside its routed experts: window-only attention (vLLM builds the MTP
        layer at ratio 1), hyper-connections, shared experts and gate, ``e_proj`` and ``h_proj`` and its
        hc head."""
        s = self.shape
        projections = 2 * self.attn.bytes(s.hidden, s.hidden)
        head = s.hc_mult * s.hc_mult * s.hidden * FLOAT32_BYTES
        rest = _moe_layer_rest(cfg, modelslim, self, recipe.shared_tp, path)
        return self.attention(0, recipe) + self.hyper_connections() + rest + projections + head

    def ascend_cache(self, recipe: Recipe, cfg: dict, kv_cache_dtype: str, path: str | None) -> AscendV4Cache:
        """The cache as vLLM-Ascend lays it out for this recipe (the drafter's window layer with MTP)."""
        mtp = self.shape.mtp_layers if recipe.speculative_tokens else 0
        return ascend_v4_cache(self.shape, cfg, recipe.block_size, mtp, kv_cache_dtype, path)

    def cache(self, recipe: Recipe, ascend: AscendV4Cache | None) -> tuple[int, int, int, str]:
        """The cache's bytes per token, per sequence and of the step's in-flight tokens, and its format:
        vLLM-Ascend's pages (``ascend``) or vLLM's layout, whose MTP layer keeps a window only (vLLM's
        sliding-window admission: window - 1 + the in-flight tokens per sequence)."""
        if ascend is not None:
            return ascend.per_token, ascend.per_sequence, ascend.step_bytes(recipe.max_num_batched_tokens), ascend.describe()
        c, mtp = self.vllm_cache, bool(recipe.speculative_tokens)
        per_sequence = c.per_sequence + (c.layer_state_bytes(0) if mtp else 0)
        step = recipe.max_num_batched_tokens * (c.state_row + (c.layer_state_row(0) if mtp else 0))
        return c.per_token, per_sequence, step, c.describe()


def model_of(cfg: dict, modelslim: dict | None, path: str | None = None, kv_cache_dtype: str = "auto") -> MlaModel | V4Model:
    """The preflight's model of a config: ``V4Model`` for DeepSeek-V4, ``MlaModel`` for MLA."""
    shape = attention_shape(cfg, path, "the preflight")  # the one reader of the attention's shape fields
    if isinstance(shape, V4Shape):
        return V4Model.of(shape, cfg, modelslim, path, kv_cache_dtype)
    return MlaModel.of(shape, cfg, modelslim, path)


def _moe_layer_rest(cfg: dict, modelslim: dict | None, model: MlaModel | V4Model, shared_tp: int, path: str | None) -> int:
    """One MoE layer's shared experts (1 / ``shared_tp``) and router gate (replicated, model dtype) on a rank."""
    f, b = ConfigFields(cfg, path), model.dtype_bytes
    experts, shared = f.integer("n_routed_experts", 1), f.integer("n_shared_experts", 0, default=0)
    moe_inter, fmt = f.integer("moe_intermediate_size", 1), linear_format(cfg, modelslim, path, "shared_experts.")
    h, inter = model.hidden, shared * moe_inter  # the shared experts as one MLP (vLLM's DeepseekV2MLP)
    mlp = 2 * _split(fmt, inter, h, shared_tp) + _split(fmt, h, inter, shared_tp, row_parallel=True) if shared else 0
    return mlp + experts * h * b


def kept_copies(
    recipe: Recipe, memory: ModelMemory, model: MlaModel | V4Model, cfg: dict, modelslim: dict | None, path: str | None
) -> tuple:
    """What the engine keeps on a rank beside the weights (module docstring), by name: (name, bytes)."""
    copies = model.copies(recipe)
    if recipe.native_eplb:
        copies.append(("native EPLB swap buffer", recipe.slots_per_rank * memory.bytes_per_expert))
    if recipe.speculative_tokens:
        layer = model.mtp_layer(cfg, modelslim, recipe, path)
        copies.append(("MTP layer", layer + recipe.slots_per_rank * memory.bytes_per_expert))
    return tuple(copies)


def mc2_tokens_per_rank(recipe: Recipe) -> int:
    """vLLM-Ascend's MC2 capacity per TP rank (``set_mc2_tokens_capacity``; its largest graph by default
    max_num_seqs x the decode query length (1 + speculative tokens) up to 512, and vLLM caps it at
    max_num_batched_tokens); 0 on vLLM (no MC2)."""
    if not recipe.ascend:
        return 0
    query = 1 + recipe.speculative_tokens
    if recipe.prefill_mc2:
        tokens = recipe.max_num_batched_tokens
    elif recipe.graphs:
        tokens = min(recipe.max_num_seqs * query, GRAPH_CAP, recipe.max_num_batched_tokens)
    else:
        tokens = recipe.max_num_seqs * query
    return min(-(-tokens // recipe.tp), MC2_TOKEN_CAP)


def mc2_hccl_bytes(cfg: dict, slots_per_rank: int, ep: int, max_bs: int, path: str | None = None) -> int:
    """The HCCL buffer MC2's dispatch and combine need (CANN's A3 rule, module docstring)."""
    f = ConfigFields(cfg, path)
    hidden, top_k = f.integer("hidden_size", 1), f.integer("num_experts_per_tok", 1)
    shared = f.integer("n_shared_experts", 0, default=0)
    token = _align(_align(2 * hidden, 32) + 64, 512)
    return 2 * (slots_per_rank * max_bs * ep * token + (top_k + shared) * max_bs * _align(2 * hidden, 512))


def size_rank(
    recipe: Recipe, memory: ModelMemory, cfg: dict, modelslim: dict | None, path: str | None = None, kv_cache_dtype: str = "auto"
) -> RankSizing:
    """One rank's memory under ``recipe`` and what does not fit (one sentence each, with the numbers);
    ``kv_cache_dtype`` as ``memory`` was priced with."""
    ep = recipe.dp * recipe.tp
    model = model_of(cfg, modelslim, path, kv_cache_dtype)
    non_routed = model.non_routed(cfg, modelslim, recipe, path)
    routed = recipe.slots_per_rank * memory.num_moe_layers * memory.bytes_per_expert
    max_bs = mc2_tokens_per_rank(recipe)
    need_mb = (
        max(HCCL_DEFAULT_MB, -(-mc2_hccl_bytes(cfg, recipe.slots_per_rank, ep, max_bs, path) // MIB)) if recipe.ascend else 0
    )
    set_mb = recipe.hccl_buffsize_mb if recipe.hccl_buffsize_mb is not None else need_mb
    hccl = 2 * set_mb * MIB
    budget = int(recipe.gpu_memory_utilization * recipe.device_bytes)
    copies = kept_copies(recipe, memory, model, cfg, modelslim, path)
    kept = sum(size for _, size in copies)
    kv = budget - non_routed - routed - kept - hccl - recipe.reserve_bytes
    if isinstance(model, V4Model):
        ascend = model.ascend_cache(recipe, cfg, kv_cache_dtype, path) if recipe.ascend else None
        per_token, per_sequence, step, kv_format = model.cache(recipe, ascend)
    else:
        per_token, per_sequence, step, kv_format = model.cache(memory, recipe)
    # what max_num_seqs sequences hold whatever their lengths, and the step's in-flight tokens' windows
    states = recipe.max_num_seqs * per_sequence + step
    kv_tokens = max(kv - states, 0) // per_token
    shared, own = recipe.shared_prefix, recipe.max_model_len - recipe.shared_prefix
    need = shared + recipe.max_num_seqs * own  # the shared prefix held once
    problems = []
    weights = f"non-routed {non_routed / GIB:.1f} GiB + routed {routed / GIB:.1f} GiB ({recipe.slots_per_rank} slots x "
    weights += f"{memory.num_moe_layers} MoE layers x {memory.bytes_per_expert / MIB:.1f} MiB)"
    weights += "".join(f" + {name} {size / GIB:.2f} GiB" for name, size in copies)
    if kv <= 0:
        problems.append(
            f"the weights do not fit: {weights} + HCCL {hccl / GIB:.1f} GiB + reserve {recipe.reserve_bytes / GIB:.1f} GiB = "
            f"{(budget - kv) / GIB:.1f} GiB per rank, above {recipe.gpu_memory_utilization:g} x "
            f"{recipe.device_bytes / GIB:.0f} GiB = {budget / GIB:.1f} GiB"
        )
    elif kv_tokens < need:
        held = f" ({shared:,} shared + {recipe.max_num_seqs} x {own:,})" if shared else ""
        problems.append(
            f"the KV cache does not hold max_num_seqs {recipe.max_num_seqs} x max_model_len {recipe.max_model_len:,}{held} = "
            f"{need:,} tokens: {kv / GIB:.1f} GiB left after {weights} holds {kv_tokens:,} tokens of {per_token:,} B"
            + (f" beside {recipe.max_num_seqs} sequences' windows and compressor states {states / GIB:.2f} GiB" if states else "")
        )
    if recipe.hccl_buffsize_mb is not None and recipe.hccl_buffsize_mb < need_mb:
        problems.append(
            f"HCCL_BUFFSIZE {recipe.hccl_buffsize_mb} MB is below the {need_mb} MB MC2 needs for "
            f"{max_bs} tokens per rank x {recipe.slots_per_rank} local experts x EP {ep}"
        )
    return RankSizing(
        non_routed,
        routed,
        hccl,
        recipe.reserve_bytes,
        budget,
        kv,
        per_token,
        kv_tokens,
        max(kv - per_sequence - step, 0) // per_token,
        max(kv - step - shared * per_token, 0) // (own * per_token + per_sequence),
        max_bs,
        need_mb,
        tuple(problems),
        copies,
        per_sequence,
        states,
        kv_format,
    )
