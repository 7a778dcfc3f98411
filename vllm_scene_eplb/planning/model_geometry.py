"""MoE geometry of a Hugging Face model config (config.json): which layers are MoE, how many experts,
how they are routed (top-k, routing groups, DeepSeek-V4's hash layers); and the shapes the
preflight's bytes and the screen's FLOPs are priced from: DeepSeek-V2/V3's MLA (``MlaShape``) and
DeepSeek-V4's compressed sparse attention (``V4Shape``), one reader for both (``attention_shape``).

DeepSeek-V4 comes in two spellings, read alike: the one vLLM reads (``num_hash_layers``, per-layer
``compress_ratios``) and the one transformers >= 5.16 writes (``mlp_layer_types`` of ``hash_moe`` /
``moe``, ``layer_types`` with ``compress_rates``); a config that states both must say the same.
Reading a model's files is ``model_files``'s."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..errors import SceneEplbError


@dataclass(frozen=True)
class ModelGeometry:
    """The parts of a model a layout must match (layer count, MoE layers, expert count) and how
    its router picks experts: ``top_k`` per token, from ``expert_groups`` routing groups
    (DeepSeek-V3's ``n_group`` = 8; 1 = no groups), which the fitter's group hedge uses; and the
    ``hash_layers``, MoE layers that route by a table on the token id instead of by scores
    (DeepSeek-V4's ``hash_moe`` layers, its first ``num_hash_layers``: their load is a function of
    the tokens alone).

    DeepSeek-V4-Flash: ``ModelGeometry(43, (0, ..., 42), 256, top_k=6, expert_groups=1, hash_layers=(0, 1, 2))``.
    """

    num_layers: int
    moe_layers: tuple[int, ...]
    num_experts: int
    top_k: int | None = None
    expert_groups: int = 1
    hash_layers: tuple[int, ...] = ()

    def routing(self) -> dict:
        """What a counts file records of the router: top_k and expert_groups."""
        return {"top_k": self.top_k, "expert_groups": self.expert_groups}


_MISSING = object()
MAX_CONFIG_INT = 1 << 40  # any size in a model config stays far below this


class ConfigFields:
    """Typed reads of a model config's fields: each names the field and the file when it is missing
    or has the wrong type or range (a JSON null counts as absent)."""

    def __init__(self, cfg: dict, path: str | None):
        self.cfg, self.path = cfg, path

    def _fail(self, key: str, want: str) -> SceneEplbError:
        return SceneEplbError(f"config {key} must be {want}, got {self.cfg.get(key)!r}", self.path)

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def integer(self, key: str, low: int, default=_MISSING, high: int = MAX_CONFIG_INT):
        """An integer in [low, high]; ``default`` when absent (required without one)."""
        value = self.cfg.get(key)
        if value is None:
            if default is _MISSING:
                raise SceneEplbError(f"config has no {key}", self.path)
            return default
        if type(value) is not int or not low <= value <= high:
            raise self._fail(key, f"an integer in [{low}, {high}]")
        return value

    def int_list(self, key: str, low: int = 0) -> list[int]:
        """A list of integers >= low (empty when absent)."""
        value = self.cfg.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(type(v) is int and v >= low for v in value):
            raise self._fail(key, f"a list of integers >= {low}")
        return value

    def text(self, key: str, default: str) -> str:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._fail(key, "a string")
        return value

    def obj(self, key: str) -> dict | None:
        """A JSON object, or None when absent."""
        value = self.cfg.get(key)
        if value is not None and not isinstance(value, dict):
            raise self._fail(key, "a JSON object")
        return value


def text_config(cfg: dict, path: str | None) -> dict:
    """The language model's part of a config: ``text_config`` when there is one (multimodal models)."""
    inner = ConfigFields(cfg, path).obj("text_config")
    return cfg if inner is None else inner


def _moe_layers(f: ConfigFields, num_layers: int) -> tuple[int, ...]:
    if f.has("first_k_dense_replace"):  # DeepSeek-V2/V3 family
        freq = f.integer("moe_layer_freq", 1, default=1)
        k = f.integer("first_k_dense_replace", 0)
        return tuple(i for i in range(num_layers) if i >= k and i % freq == 0)
    step = f.integer("decoder_sparse_step", 1, default=1)  # Qwen2/3-MoE family
    dense = set(f.int_list("mlp_only_layers"))
    return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def from_hf_config(cfg: dict, path: str | None = None) -> ModelGeometry:
    """Read the MoE geometry from a config dict (a model directory's config.json)."""
    f = ConfigFields(text_config(cfg, path), path)
    key = next((k for k in ("n_routed_experts", "num_experts", "num_local_experts") if f.has(k)), None)
    if key is None:
        raise SceneEplbError("config has no MoE expert count (n_routed_experts / num_experts / num_local_experts)", path)
    experts = f.integer(key, 1, high=1 << 16)
    layers = f.integer("num_hidden_layers", 1, high=1 << 16)
    top_k = f.integer("num_experts_per_tok", 1, default=None, high=experts)
    groups = f.integer("n_group", 1, default=1, high=experts)
    if experts % groups:
        raise SceneEplbError(f"config n_group {groups} does not divide {experts} experts", path)
    moe_layers = _moe_layers(f, layers)
    if not moe_layers:
        raise SceneEplbError(f"config describes no MoE layer among its {layers} layers", path)
    return ModelGeometry(layers, moe_layers, experts, top_k, groups, _hash_layers(f, moe_layers, layers))


V4_MLP_KINDS = ("hash_moe", "moe")  # transformers' DEEPSEEK_V4_MLP_LAYER_TYPES
V4_DEFAULT_HASH_LAYERS = 3  # transformers' DeepseekV4Config.default_num_hash_layers, when a config states none


def _hash_layers(f: ConfigFields, moe_layers: tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """DeepSeek-V4's hash-routed MoE layers, each of them a MoE layer: the first ``num_hash_layers``
    model layers (vLLM's ``extract_layer_index(prefix) < config.num_hash_layers``), or the
    ``hash_moe`` entries of ``mlp_layer_types`` (transformers >= 5.16, which writes no
    ``num_hash_layers``); both stated must agree; a ``deepseek_v4`` config with neither has
    transformers' default 3."""
    legacy = None
    if f.has("num_hash_layers"):
        legacy = tuple(range(f.integer("num_hash_layers", 0, high=len(moe_layers))))
    kinds = f.cfg.get("mlp_layer_types")
    v4 = f.cfg.get("model_type") == "deepseek_v4"
    typed = None
    if kinds is not None and (v4 or (isinstance(kinds, list) and set(kinds) <= set(V4_MLP_KINDS))):
        if not isinstance(kinds, list) or len(kinds) != num_layers or not set(kinds) <= set(V4_MLP_KINDS):
            raise f._fail("mlp_layer_types", f"a list of one of {V4_MLP_KINDS} per layer ({num_layers})")
        typed = tuple(i for i, kind in enumerate(kinds) if kind == "hash_moe")
    if legacy is not None and typed is not None and legacy != typed:
        raise SceneEplbError(
            f"config num_hash_layers {len(legacy)} (layers {list(legacy)}) and mlp_layer_types (hash_moe at "
            f"layers {list(typed)}) disagree: state one of them",
            f.path,
        )
    hashed = legacy if legacy is not None else typed
    if hashed is None:
        hashed = tuple(range(min(V4_DEFAULT_HASH_LAYERS, num_layers))) if v4 else ()
    if not set(hashed) <= set(moe_layers):
        what = f"num_hash_layers {len(hashed)}" if legacy is not None else f"hash layers {list(hashed)}"
        raise SceneEplbError(f"config {what} names layers that are not MoE layers {list(moe_layers)}", f.path)
    return hashed


def _config_key(key: str, low: int = 1, default: int | None = None):
    """A dataclass field read from the config field ``key``: an integer >= ``low`` (``default``
    when absent; required without one)."""
    return field(metadata={"key": key, "low": low, "default": _MISSING if default is None else default})


def _read_keys(cls, f: ConfigFields) -> dict:
    """Every ``_config_key`` field of the dataclass ``cls`` read from ``f``."""
    return {x.name: f.integer(x.metadata["key"], x.metadata["low"], x.metadata["default"]) for x in fields(cls) if x.metadata}


@dataclass(frozen=True)
class MlaShape:
    """The shapes of a DeepSeek-style model with MLA attention (DeepSeek-V2/V3's config field names),
    read once (``attention_shape``) so that every price of its weights and work reads the same
    fields the same way."""

    hidden: int = _config_key("hidden_size")
    vocab: int = _config_key("vocab_size")
    layers: int = _config_key("num_hidden_layers")
    dense_layers: int = _config_key("first_k_dense_replace", 0, 0)  # leading layers with a dense MLP
    heads: int = _config_key("num_attention_heads")
    q_lora: int = _config_key("q_lora_rank")  # the query's low-rank latent
    kv_lora: int = _config_key("kv_lora_rank")  # the compressed KV latent the cache keeps
    qk_nope: int = _config_key("qk_nope_head_dim")  # per head, the query/key part without rotary embedding
    qk_rope: int = _config_key("qk_rope_head_dim", 0)  # per head, the rotary part (one shared key per token)
    v_head: int = _config_key("v_head_dim")
    experts: int = _config_key("n_routed_experts")
    shared: int = _config_key("n_shared_experts", 0, 0)
    intermediate: int = _config_key("intermediate_size")  # a dense layer's MLP
    moe_intermediate: int = _config_key("moe_intermediate_size")  # one expert's MLP


V4_RATIOS = (0, 4, 128)  # the compress ratios vLLM's DeepSeek-V4 builds (0: sliding window only)


@dataclass(frozen=True)
class V4Shape:
    """The shapes of a DeepSeek-V4 model (vLLM's V4 field names): one KV head of ``head_dim`` that is
    both key and value, a sliding window on every layer and, per layer, ``compress_ratios``: 0 the
    window only, 4 KV compressed 4:1 with an indexer keeping ``index_topk`` entries per query, 128
    compressed 128:1 and attended in full; the output projection grouped (``o_groups`` x
    ``o_lora``); the residual stream ``hc_mult`` x hidden (hyper-connections)."""

    hidden: int = _config_key("hidden_size")
    vocab: int = _config_key("vocab_size")
    layers: int = _config_key("num_hidden_layers")
    heads: int = _config_key("num_attention_heads")
    head_dim: int = _config_key("head_dim")  # the one KV head's size, rope included
    qk_rope: int = _config_key("qk_rope_head_dim", 0)
    q_lora: int = _config_key("q_lora_rank")
    o_groups: int = _config_key("o_groups")
    o_lora: int = _config_key("o_lora_rank")
    window: int = _config_key("sliding_window")
    index_heads: int = _config_key("index_n_heads")
    index_head_dim: int = _config_key("index_head_dim")
    index_topk: int = _config_key("index_topk")
    hc_mult: int = _config_key("hc_mult", 1, 1)
    experts: int = _config_key("n_routed_experts")
    shared: int = _config_key("n_shared_experts", 0, 0)
    moe_intermediate: int = _config_key("moe_intermediate_size")
    mtp_layers: int = _config_key("num_nextn_predict_layers", 0, 0)
    compress_ratios: tuple[int, ...] = ()  # one per model layer (an entry past them, the MTP layer's, is not read)

    def __post_init__(self) -> None:
        if self.heads % self.o_groups:
            raise SceneEplbError(f"config o_groups {self.o_groups} does not divide num_attention_heads {self.heads}")
        if len(self.compress_ratios) != self.layers:
            raise SceneEplbError(f"config compress_ratios names {len(self.compress_ratios)} of {self.layers} layers")

    def layers_at(self, ratio: int) -> int:
        """How many model layers have compress ratio ``ratio``."""
        return self.compress_ratios.count(ratio)

    @staticmethod
    def overlap(ratio: int) -> int:
        """The compressor's overlap factor (vLLM's ``coff``): 2 at ratio 4 (overlapping windows), else 1."""
        return 2 if ratio == 4 else 1

    def attention_linears(self, ratio: int) -> tuple[Linear, ...]:
        """A layer's attention weights at compress ratio ``ratio`` as vLLM 0.32's ``DeepseekV4Attention``
        builds them: wq_a and wkv fused and replicated, wq_b and the grouped wo_a column-parallel, wo_b
        row-parallel; at ratio > 1 the compressor's wkv and wgate (replicated, unquantised); at ratio 4
        the indexer's wq_b (replicated), weights_proj and compressor (replicated, unquantised)."""
        h, hd = self.hidden, self.head_dim
        linears = [
            Linear("wq_a+wkv", self.q_lora + hd, h, quantized=True, sharded=False),
            Linear("wq_b", self.heads * hd, self.q_lora, quantized=True, sharded=True),
            Linear("wo_a", self.o_groups * self.o_lora, self.heads * hd // self.o_groups, quantized=True, sharded=True),
            Linear("wo_b", h, self.o_groups * self.o_lora, quantized=True, sharded=True),
        ]
        if ratio > 1:
            linears.append(Linear("compressor", 2 * self.overlap(ratio) * hd, h, quantized=False, sharded=False))
        if ratio == 4:
            ih = self.index_heads * self.index_head_dim
            linears += [
                Linear("indexer wq_b", ih, self.q_lora, quantized=True, sharded=False),
                Linear("indexer weights_proj", self.index_heads, h, quantized=False, sharded=False),
                Linear("indexer compressor", 2 * 2 * self.index_head_dim, h, quantized=False, sharded=False),
            ]
        return tuple(linears)

    @property
    def hc_weights(self) -> int:
        """One layer's hyper-connection mixing weights (float32): attention's and the MLP's, each
        (2 + hc_mult) x hc_mult rows over the hc_mult x hidden residual stream."""
        return 2 * (2 + self.hc_mult) * self.hc_mult * self.hc_mult * self.hidden


@dataclass(frozen=True)
class Linear:
    """One weight of a layer: [rows, cols], quantised with the checkpoint's linear format or kept
    in the model dtype, and split over TP ranks or replicated on each."""

    name: str
    rows: int
    cols: int
    quantized: bool
    sharded: bool

    @property
    def weights(self) -> int:
        return self.rows * self.cols


V4_LAYER_TYPES = {"sliding_attention": 0}  # transformers' layer_types; the compressed kinds' ratios are compress_rates'
V4_COMPRESS_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}  # transformers' defaults


def v4_compress_ratios(f: ConfigFields) -> tuple[int, ...] | None:
    """A DeepSeek-V4 config's compress ratio per model layer, None for any other model: vLLM's
    ``compress_ratios`` (one per layer, the MTP layer's after them), or transformers' ``layer_types``
    (``sliding_attention`` 0, the compressed kinds at ``compress_rates``); both stated must agree."""
    layers = f.integer("num_hidden_layers", 1, high=1 << 16)
    legacy = None
    if f.has("compress_ratios"):
        ratios = f.int_list("compress_ratios")
        if len(ratios) < layers or not set(ratios[:layers]) <= set(V4_RATIOS):
            raise f._fail("compress_ratios", f"a list of one of {V4_RATIOS} per layer ({layers})")
        legacy = tuple(ratios[:layers])
    typed = None
    if f.has("layer_types") and f.cfg.get("model_type") == "deepseek_v4":
        rates = {**V4_COMPRESS_RATES, **(f.obj("compress_rates") or {})}
        if not all(type(r) is int and r in V4_RATIOS for r in rates.values()):
            raise f._fail("compress_rates", f"an object of ratios among {V4_RATIOS}")
        table = {**V4_LAYER_TYPES, **rates}
        kinds = f.cfg["layer_types"]
        if not isinstance(kinds, list) or len(kinds) != layers or not all(isinstance(k, str) and k in table for k in kinds):
            raise f._fail("layer_types", f"a list of one of {sorted(table)} per layer ({layers})")
        typed = tuple(table[k] for k in kinds)
    if legacy is not None and typed is not None and legacy != typed:
        first = next(i for i, (a, b) in enumerate(zip(legacy, typed)) if a != b)
        raise SceneEplbError(
            f"config compress_ratios and layer_types disagree at layer {first} ({legacy[first]} against "
            f"{f.cfg['layer_types'][first]}): state one of them",
            f.path,
        )
    return legacy if legacy is not None else typed


def _rope_dim(f: ConfigFields) -> int:
    """The rotary part of a V4 head: ``qk_rope_head_dim``, or transformers' ``partial_rotary_factor``
    of ``head_dim``."""
    if f.has("qk_rope_head_dim") or not f.has("partial_rotary_factor"):
        return f.integer("qk_rope_head_dim", 0, default=0)
    factor = f.cfg["partial_rotary_factor"]
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 <= factor <= 1:
        raise f._fail("partial_rotary_factor", "a number in [0, 1]")
    return int(f.integer("head_dim", 1) * factor)


def attention_shape(cfg: dict, path: str | None, what: str = "this tool") -> MlaShape | V4Shape:
    """The shape of a config's text model: ``V4Shape`` for DeepSeek-V4 (``v4_compress_ratios``),
    ``MlaShape`` with ``kv_lora_rank``; ``what`` names the reader in the error for any other attention."""
    f = ConfigFields(text_config(cfg, path), path)
    ratios = v4_compress_ratios(f)
    if ratios is not None:
        try:
            return V4Shape(**{**_read_keys(V4Shape, f), "qk_rope": _rope_dim(f)}, compress_ratios=ratios)
        except SceneEplbError as exc:
            raise SceneEplbError(exc.problem, path) from None
    if not f.has("kv_lora_rank"):
        raise SceneEplbError(
            f"{what} prices MLA attention (DeepSeek's kv_lora_rank) or DeepSeek-V4's compressed attention "
            "(compress_ratios or layer_types) only",
            path,
        )
    return MlaShape(**_read_keys(MlaShape, f))


@dataclass(frozen=True)
class KnownModel:
    """A model whose counts' shape names it: what a command may take from it when neither ``--model``
    nor the counts' metadata say (each one checked against its config in ``data/models/``)."""

    name: str
    geometry: ModelGeometry

    def describe(self) -> str:
        g = self.geometry
        return f"{self.name}'s shape, {g.num_layers} layers x {g.num_experts} experts"


KNOWN_MODELS = (
    KnownModel("DeepSeek-V3/R1", ModelGeometry(61, tuple(range(3, 61)), 256, top_k=8, expert_groups=8)),
    KnownModel("DeepSeek-V4-Flash", ModelGeometry(43, tuple(range(43)), 256, top_k=6, hash_layers=(0, 1, 2))),
)


def known_model(num_layers: int, num_experts: int) -> KnownModel | None:
    """The known model with counts of ``num_layers`` x ``num_experts``, if any."""
    return next((m for m in KNOWN_MODELS if (m.geometry.num_layers, m.geometry.num_experts) == (num_layers, num_experts)), None)
