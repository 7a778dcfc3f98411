"""What one engine step costs per new token, part by part, for a DeepSeek-style MoE model (MLA, or
DeepSeek-V4's compressed sparse attention), and so
what share of the step the routed experts take and what a better-balanced layout could give at most
(``scene-eplb screen``): a screen before a scene is recorded, from the model's shapes alone.

One EP rank of a node that runs attention data-parallel (each rank its own requests, one prefill
request per step) and the routed experts expert-parallel over ``ep_size`` ranks, as the field's P
node (DP16 / EP16). Every part's **work** is its FLOPs (2 per multiply-add) and the bytes it reads
from device memory (its weights once per step, the KV latents it attends to); its **time** is the
roofline of a named machine, max(FLOPs / peak FLOP/s, bytes / memory bandwidth), every kernel at
the peak (one efficiency for all cancels in the shares). Parts, per layer:

- **attention projections** (every layer): q_a, q_b, kv_a, kv_b and o, 2 FLOPs per weight per token,
  the same in the absorbed (decode) and the unabsorbed (prefill) form of MLA;
- **attention context** (every layer), what grows with the context c a token attends to (itself
  included): prefill runs MLA as multi-head attention over up-projected keys and values,
  2 x heads x (qk_nope + qk_rope + v_head) x c, and up-projects the latents of every chunk's prefix
  (prefix-cached tokens and earlier chunks: vLLM's MLA prefill does so per chunk), 2 x kv_lora x
  heads x (qk_nope + v_head) per prefix token, reading the chunk's context latents once; decode runs
  it over the latents (absorbed), 2 x heads x (2 x kv_lora + qk_rope) x c, reading c latents;
- **dense MLP** (the ``first_k_dense_replace`` layers), **shared experts** and **routed experts**
  (top-k of them per token; the rank reads the weights of its experts / ep_size experts that any of
  the node's tokens in the step touched, 1 - (1 - top_k / E)^(tokens x ep_size) of them);
- **the rest**: the router gate and the LM head (prefill samples one token per request, decode one
  per token). Norms, the embedding lookup, activations' bytes and the dispatch/combine
  communication are left out.

**DeepSeek-V4** (``V4Shape``) replaces MLA and the dense MLP with, per layer by its compress ratio:

- **attention projections**: wq_a, wkv, wq_b, the grouped wo_a and wo_b; at ratio > 1 the
  compressor, at ratio 4 the indexer's wq_b, weights_proj and compressor (unquantised ones at the
  model dtype), 2 FLOPs per weight per token;
- **attention context**: one KV entry of head_dim is key and value, 2 x heads x 2 x head_dim FLOPs
  per key; a token at context c attends to min(window, c) window keys plus, at ratio 4, the
  indexer's top ``index_topk`` of c / 4 compressed entries (the indexer scores all c / 4, 2 x
  index_heads x index_head_dim each), at ratio 128 all c / 128; decode reads each key and every
  indexer key it scores, prefill the chunk's cache once (``V4Cache``);
- **hyper-connections**: the mixing weights (float32) over the hc_mult x hidden stream, twice a layer,
  and the head's.

**Scenes.** Prefill computes the uncached part of one prompt (``cached_share`` of it is a prefix-cache
hit: attended to, not recomputed) in chunks of ``chunk`` tokens, the cost per new token over the
request. Decode runs ``batch`` sequences per rank per step at the mean context over the output,
input + (output + 1) / 2; a prefix-cache hit does not change a decode token's work.

**Scores.** A layout's ideal score B (max / mean rank load, ``score``) multiplies the slowest rank's
routed FLOPs, not the weights it reads (a rank reads its experts whatever their tokens). The step
then takes ``others + routed(B)``, and a candidate at B1 gives ``step(B0) / step(B1)``, the
``ceiling_ratio``: what the node's step gains if nothing else on its critical path moves. DeepSeek-V4's
hash layers' experts are priced as any MoE layer's. Pure arithmetic, no engine, not measured on a device.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import SceneEplbError
from .memory import FLOAT32_BYTES, ModelMemory, V4Cache, linear_bytes, model_dtype_bytes, read_model_memory, v4_cache
from .model_files import ModelFiles
from .model_geometry import V4_RATIOS, MlaShape, V4Shape

ROLES = ("prefill", "decode")
# The ideal score a layout that knows nothing of the scene has: the linear layout's median layer on
# DeepSeek-V3's published routing at EP 16 is 1.86 to 2.27 (the three files in data/, a test checks).
DEFAULT_SCORE = 2.0
DEFAULT_CHUNK = 8192  # the field P node's chunk
DEFAULT_BATCH = 8  # decode sequences per rank: the field's concurrency 128 over 8 D cards of two dies each
DEFAULT_EP = 16  # the field's P (and D) EP size


@dataclass(frozen=True)
class Machine:
    """One rank's device as the roofline sees it: peak dense matmul FLOP/s and memory bandwidth."""

    name: str
    peak_flops: float
    bytes_per_s: float
    source: str  # where the two numbers come from

    def __post_init__(self) -> None:
        for key in ("peak_flops", "bytes_per_s"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise SceneEplbError(f"machine {key} must be a finite number > 0, got {value!r}")


MACHINES = {
    "910c": Machine(
        "910c",
        390e12,
        1.6e12,
        "one Ascend 910C die (a rank): half of the package's publicly reported 780 TFLOP/s BF16 and "
        "3.2 TB/s HBM (estimates, not a Huawei datasheet)",
    ),
    "h200": Machine("h200", 989e12, 4.8e12, "NVIDIA H200 SXM datasheet: 989 TFLOP/s dense BF16, 4.8 TB/s HBM3e"),
}


@dataclass(frozen=True)
class PricedScene:
    """A serving scene as the screen prices it (see the module docstring)."""

    role: str
    input_len: int
    output_len: int
    cached_share: float  # prefix-cache hits over the prompt, in [0, 1)
    chunk: int = DEFAULT_CHUNK
    batch: int = DEFAULT_BATCH
    ep_size: int = DEFAULT_EP

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise SceneEplbError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        for key in ("input_len", "output_len", "chunk", "batch", "ep_size"):
            value = getattr(self, key)
            if type(value) is not int or value < 1:
                raise SceneEplbError(f"{key} must be an integer >= 1, got {value!r}")
        share = self.cached_share
        if not isinstance(share, (int, float)) or not (0 <= share < 1):  # NaN fails both comparisons
            raise SceneEplbError(f"cached_share must be a number in [0, 1), got {share!r}")

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens found in the prefix cache (at least one token is left to compute)."""
        return math.floor(self.input_len * self.cached_share)

    @property
    def mean_context(self) -> float:
        """The mean context a new token attends to, itself included."""
        if self.role == "decode":
            return self.input_len + (self.output_len + 1) / 2
        return self.cached_tokens + (self.input_len - self.cached_tokens + 1) / 2


@dataclass(frozen=True)
class StepModel:
    """The model as the screen prices it: its shapes (MLA or DeepSeek-V4's), top-k, its routed
    expert's and KV token's bytes (``memory``), the other linear weights' bytes and, for V4, its
    cache's layout (``cache``)."""

    shape: MlaShape | V4Shape
    top_k: int
    memory: ModelMemory
    linear_bytes: float  # per weight of every linear layer outside the routed experts, scales included
    linear_format: str
    dtype_bytes: int  # the model dtype's: unquantised weights (V4's compressors, hyper-connections in float32 aside)
    cache: V4Cache | None = None  # DeepSeek-V4's
    hash_layers: int = 0  # DeepSeek-V4's MoE layers routed by token id

    @property
    def moe_layers(self) -> int:
        return self.memory.num_moe_layers

    @property
    def dense_layers(self) -> int:
        return self.shape.layers - self.moe_layers

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes per weight of a routed expert, scales included."""
        return self.memory.bytes_per_expert / (3 * self.shape.hidden * self.shape.moe_intermediate)

    @property
    def kv_bytes(self) -> int:
        """One token's KV latent in one layer."""
        return self.memory.kv_bytes_per_token // self.shape.layers


def read_step_model(model: ModelFiles, kv_cache_dtype: str = "auto", expert_bytes: int | None = None) -> StepModel:
    """A model's ``StepModel`` (``expert_bytes`` as ``--expert-bytes``); one line naming the field
    when the config is not a DeepSeek-style MLA or DeepSeek-V4 MoE model."""
    memory = read_model_memory(model, kv_cache_dtype, expert_bytes)
    shape = model.attention("the screen")
    top_k = model.geometry.top_k
    if top_k is None:
        raise SceneEplbError("config has no num_experts_per_tok (the routed experts' top-k)", model.where)
    cfg, where = model.cfg, model.where
    linear, linear_format = linear_bytes(cfg, model.modelslim, where)
    cache = v4_cache(shape, cfg, kv_cache_dtype, where) if isinstance(shape, V4Shape) else None
    return StepModel(
        shape, top_k, memory, linear, linear_format, model_dtype_bytes(cfg, where), cache, len(model.geometry.hash_layers)
    )


@dataclass(frozen=True)
class Part:
    """One part of the step per new token: its work, its time on the machine, which side of the
    roofline set that time (``flops`` or ``bytes``) and its share of the step at the layout's score."""

    name: str
    flops: float
    bytes: float
    time_us: float
    bound: str
    share: float


@dataclass(frozen=True)
class Screen:
    """What ``scene-eplb screen`` answers: the parts of a step, the routed experts' share of it and
    the step ratio a layout at ``candidate_score`` gives over one at ``score``, with its assumptions."""

    scene: PricedScene
    machine: Machine
    parts: tuple[Part, ...]  # work is the mean rank's; the routed experts' time and share at ``score``
    score: float
    candidate_score: float
    routed_share: float  # at ``score``
    routed_share_perfect: float  # at score 1, a perfect layout
    ceiling_ratio: float  # step(score) / step(candidate_score)
    assumptions: tuple[str, ...]

    def to_dict(self) -> dict:
        scene = {**asdict(self.scene), "cached_tokens": self.scene.cached_tokens, "mean_context": self.scene.mean_context}
        return {
            **asdict(self),
            "scene": scene,
            "parts": {p.name: {k: v for k, v in asdict(p).items() if k != "name"} for p in self.parts},
            "assumptions": list(self.assumptions),
        }


@dataclass(frozen=True)
class _Work:
    """A part's FLOPs and bytes in each step of the scene (arrays over the steps)."""

    flops: np.ndarray
    bytes: np.ndarray

    def seconds(self, machine: Machine, score: float = 1.0) -> float:
        """The steps' roofline time, the FLOPs scaled by ``score`` (the slowest rank's over the mean)."""
        return float(np.maximum(score * self.flops / machine.peak_flops, self.bytes / machine.bytes_per_s).sum())


def _steps(scene: PricedScene) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per step of one rank: new tokens, the context they attend to summed over them, the prefix the
    step up-projects (prefill) and the tokens it samples."""
    if scene.role == "decode":
        one = np.ones(1)
        return one * scene.batch, one * scene.batch * scene.mean_context, one * 0.0, one * scene.batch
    cached, new = scene.cached_tokens, scene.input_len - scene.cached_tokens
    start = np.arange(0, new, scene.chunk, dtype=np.float64)
    tokens = np.minimum(scene.chunk, new - start)
    prefix = cached + start
    context = tokens * prefix + tokens * (tokens + 1) / 2  # token at position p attends to p + 1 tokens
    sampled = np.zeros_like(tokens)
    sampled[-1] = 1.0
    return tokens, context, prefix, sampled


def _mla_parts(model: StepModel, m: MlaShape, scene: PricedScene) -> dict[str, _Work]:
    """MLA attention and the dense layers' MLP per step (module docstring)."""
    wb = model.linear_bytes
    tokens, context, prefix, _ = _steps(scene)
    steps = np.ones_like(tokens)
    attn_weights = (
        m.hidden * m.q_lora
        + m.q_lora * m.heads * (m.qk_nope + m.qk_rope)
        + m.hidden * (m.kv_lora + m.qk_rope)
        + m.kv_lora * m.heads * (m.qk_nope + m.v_head)
        + m.heads * m.v_head * m.hidden
    )
    if scene.role == "decode":
        ctx_flops = 2 * m.heads * (2 * m.kv_lora + m.qk_rope) * context
        ctx_bytes = context * model.kv_bytes
    else:
        upproject = 2 * m.kv_lora * m.heads * (m.qk_nope + m.v_head) * prefix
        ctx_flops = 2 * m.heads * (m.qk_nope + m.qk_rope + m.v_head) * context + upproject
        ctx_bytes = (prefix + tokens) * model.kv_bytes
    layers, dense = m.layers, model.dense_layers
    return {
        "attention_projections": _Work(layers * 2 * attn_weights * tokens, layers * attn_weights * wb * steps),
        "attention_context": _Work(layers * ctx_flops, layers * ctx_bytes),
        "dense_mlp": _Work(
            dense * 2 * 3 * m.hidden * m.intermediate * tokens, dense * 3 * m.hidden * m.intermediate * wb * steps
        ),
    }


def _context_sums(scene: PricedScene, f) -> np.ndarray:
    """Per step, ``f(c)`` summed over its new tokens, c the context each attends to (itself included):
    every position of each prefill chunk, or decode's batch at the mean context."""
    if scene.role == "decode":
        return np.array([scene.batch * float(f(np.float64(scene.mean_context)))])
    c = np.arange(scene.cached_tokens + 1, scene.input_len + 1, dtype=np.float64)
    return np.add.reduceat(f(c), np.arange(0, len(c), scene.chunk))


def _v4_parts(model: StepModel, m: V4Shape, cache: V4Cache, scene: PricedScene) -> dict[str, _Work]:
    """DeepSeek-V4's attention per layer kind and its hyper-connections per step (module docstring)."""
    tokens, _, prefix, _ = _steps(scene)
    steps = np.ones_like(tokens)
    proj_flops, proj_bytes, ctx_flops, ctx_bytes = (np.zeros_like(tokens) for _ in range(4))
    for ratio in V4_RATIOS:
        n = m.layers_at(ratio)
        linears = m.attention_linears(ratio)
        weights = sum(x.weights for x in linears)
        proj_flops += n * 2 * weights * tokens
        proj_bytes += n * sum(x.weights * (model.linear_bytes if x.quantized else model.dtype_bytes) for x in linears) * steps

        def keys(c, ratio=ratio):
            compressed = np.floor(c / ratio) if ratio else 0 * c
            return np.minimum(m.window, c) + (np.minimum(m.index_topk, compressed) if ratio == 4 else compressed)

        attended = _context_sums(scene, keys)
        indexed = _context_sums(scene, lambda c: np.floor(c / 4)) if ratio == 4 else 0 * tokens
        ctx_flops += n * (2 * m.heads * 2 * m.head_dim * attended + 2 * m.index_heads * m.index_head_dim * indexed)
        if scene.role == "decode":
            ctx_bytes += n * (attended * cache.entry_bytes + indexed * cache.index_key_bytes)
        else:
            window = np.minimum(m.window, prefix) + tokens
            ctx_bytes += n * (window * cache.entry_bytes + (prefix + tokens) * float(cache.layer_token_bytes(ratio)))
    hc = m.hc_mult
    mixing = 2 * (hc + hc * hc + hc) * m.hidden  # per block: collapse, the comb over the streams, expand
    head = hc * hc * m.hidden  # hc_head, once per token
    return {
        "attention_projections": _Work(proj_flops, proj_bytes),
        "attention_context": _Work(ctx_flops, ctx_bytes),
        "hyper_connections": _Work(
            (m.layers * (2 * m.hc_weights + 2 * mixing) + 2 * head) * tokens,
            (m.layers * m.hc_weights + head) * FLOAT32_BYTES * steps,
        ),
    }


def _work(model: StepModel, scene: PricedScene) -> dict[str, _Work]:
    """Every part's work per step (module docstring)."""
    m, wb = model.shape, model.linear_bytes
    tokens, _, _, sampled = _steps(scene)
    steps = np.ones_like(tokens)
    if isinstance(m, MlaShape):
        attention = _mla_parts(model, m, scene)
    else:
        assert model.cache is not None  # read_step_model reads it with every V4Shape
        attention = _v4_parts(model, m, model.cache, scene)
    expert = 3 * m.hidden * m.moe_intermediate
    touched = 1 - (1 - model.top_k / m.experts) ** (tokens * scene.ep_size)
    local_experts = m.experts / scene.ep_size
    moe = model.moe_layers
    return {
        **attention,
        "shared_experts": _Work(moe * 2 * m.shared * expert * tokens, moe * m.shared * expert * wb * steps),
        "routed_experts": _Work(
            moe * 2 * model.top_k * expert * tokens, moe * local_experts * touched * model.memory.bytes_per_expert
        ),
        "rest": _Work(
            moe * 2 * m.hidden * m.experts * tokens + 2 * m.hidden * m.vocab * sampled,
            moe * m.hidden * m.experts * wb * steps + m.hidden * m.vocab * wb * (sampled > 0),
        ),
    }


def _check_score(name: str, value: float, ep_size: int) -> None:
    if not isinstance(value, (int, float)) or not (1 <= value <= ep_size):  # NaN fails both comparisons
        raise SceneEplbError(f"{name} must be an ideal score in [1, ep_size {ep_size}] (max / mean rank load), got {value!r}")


def _model_said(model: StepModel) -> list[str]:
    """The sentences that name the model's shapes and what its attention is priced as."""
    m = model.shape
    moe = f"{model.moe_layers} MoE ({m.experts} routed experts, top-{model.top_k}, {m.shared} shared, moe_intermediate {m.moe_intermediate})"
    if isinstance(m, MlaShape):
        return [
            f"model: {m.layers} layers, {model.dense_layers} dense (intermediate {m.intermediate}), {moe}; "
            f"MLA {m.heads} heads, q_lora {m.q_lora}, kv_lora {m.kv_lora}, qk_nope {m.qk_nope}, qk_rope {m.qk_rope}, "
            f"v_head {m.v_head}; hidden {m.hidden}, vocab {m.vocab}",
            f"KV latent {model.kv_bytes} B per token and layer ({model.memory.kv_format})",
        ]
    assert model.cache is not None  # read_step_model reads it with every V4Shape
    return [
        f"model: DeepSeek-V4, {m.layers} layers, {moe}; attention: one KV head of {m.head_dim} (rope {m.qk_rope}) that is "
        f"key and value, {m.heads} query heads, q_lora {m.q_lora}, output in {m.o_groups} groups x o_lora {m.o_lora}; "
        f"hidden {m.hidden}, vocab {m.vocab}",
        f"attention per layer by compress ratio: {m.layers_at(0)} layers attend to the sliding window ({m.window}) only; "
        f"{m.layers_at(4)} at ratio 4 to the window and the top {m.index_topk} of the context's 1-in-4 compressed "
        f"entries, chosen by an indexer ({m.index_heads} heads x {m.index_head_dim}) that scores every compressed "
        f"entry; {m.layers_at(128)} at ratio 128 to the window and every 1-in-128 compressed entry; 2 x {m.heads} "
        f"heads x 2 x {m.head_dim} FLOPs per key attended (the entry is key and value); the compressors' pooling, "
        "the indexer's top-k selection and the attention sink are left out",
        f"cache: an entry {model.cache.entry_bytes} B ({model.cache.dtype}; vLLM's fp8_ds_mla packing not priced), an "
        f"indexer key {model.cache.index_key_bytes} B (fp8 with scales), as vLLM 0.32's V4 cache specs lay them out",
        f"hyper-connections: the residual stream is {m.hc_mult} x hidden; their mixing weights (float32) and "
        "matmuls are priced, the streams' reads and writes are activations (left out)",
        f"hash layers: the first {model.hash_layers} MoE layers route by a table on the token id (no score top-k); "
        "their experts' work is priced as any MoE layer's, and the score applies to them as to the others",
    ]


def _assumptions(model: StepModel, scene: PricedScene, machine: Machine, score_given: bool) -> tuple[str, ...]:
    m = model.shape
    said = [
        f"time: each part on the roofline of {machine.name}, max(FLOPs / {machine.peak_flops / 1e12:g} TFLOP/s, "
        f"bytes / {machine.bytes_per_s / 1e12:g} TB/s) ({machine.source}); every kernel at that peak",
        f"one EP rank of {scene.ep_size}: attention data-parallel (each rank its own requests), routed experts "
        f"expert-parallel ({m.experts / scene.ep_size:g} experts per rank; redundant slots not priced)",
        f"weights: the routed experts at {model.expert_weight_bytes:.4g} B per weight ({model.memory.expert_format}), "
        f"every other linear layer at {model.linear_bytes:.4g} B ({model.linear_format}), read once per step",
        *_model_said(model),
        "left out: norms, the embedding lookup, activations' bytes, dispatch/combine communication, scheduling "
        "and the pause between steps",
    ]
    mla = isinstance(m, MlaShape)
    if scene.role == "prefill":
        said.append(
            f"prefill: one request per step, its {scene.input_len - scene.cached_tokens:,} uncached tokens in chunks of "
            f"{scene.chunk:,}{', MLA as multi-head attention' if mla else ''}; the {scene.cached_tokens:,} prefix-cached "
            f"tokens are not recomputed but attended to{' and up-projected' if mla else ', their cache read once'} per "
            "chunk; one sampled token per request; the output length does not change P's work"
        )
    else:
        how = "MLA over the latents (absorbed)" if mla else "each key attended to read once per token, and every indexer key"
        said.append(
            f"decode: {scene.batch} sequences per rank per step at the mean context {scene.mean_context:,.1f} "
            f"(input + (output + 1) / 2), {how}; a prefix-cache hit does not change decode's work; no speculative decoding"
        )
    said.append(
        "score: the slowest rank's routed FLOPs are the score x the mean; the weights it reads do not change; "
        "nothing else on the step's critical path moves"
        + ("" if score_given else f"; score {DEFAULT_SCORE:g} by default (a scene-blind layout on DeepSeek-V3's routing)")
    )
    return tuple(said)


def screen(
    model: StepModel,
    scene: PricedScene,
    machine: Machine,
    score: float | None = None,
    candidate_score: float = 1.0,
) -> Screen:
    """The step of ``scene`` part by part and what a layout at ``candidate_score`` gives over one at
    ``score`` (``DEFAULT_SCORE`` when None; 1.0, a perfect layout, by default for the candidate)."""
    b0 = DEFAULT_SCORE if score is None else score
    _check_score("score", b0, scene.ep_size)
    _check_score("candidate_score", candidate_score, scene.ep_size)
    work = _work(model, scene)
    new = float(_steps(scene)[0].sum())
    routed = work["routed_experts"]
    others = sum(w.seconds(machine) for name, w in work.items() if name != "routed_experts")

    def step(score: float) -> float:
        return others + routed.seconds(machine, score)

    now = step(b0)
    parts = []
    for name, w in work.items():
        at = b0 if name == "routed_experts" else 1.0
        seconds, flops, nbytes = w.seconds(machine, at), float(w.flops.sum()), float(w.bytes.sum())
        bound = "flops" if at * flops / machine.peak_flops >= nbytes / machine.bytes_per_s else "bytes"
        parts.append(Part(name, flops / new, nbytes / new, seconds / new * 1e6, bound, seconds / now))
    return Screen(
        scene=scene,
        machine=machine,
        parts=tuple(parts),
        score=b0,
        candidate_score=candidate_score,
        routed_share=routed.seconds(machine, b0) / now,
        routed_share_perfect=routed.seconds(machine) / step(1.0),
        ceiling_ratio=now / step(candidate_score),
        assumptions=_assumptions(model, scene, machine, score is not None),
    )
