"""This vLLM worker's plugin state, and the null object that stands in when the flag is off.

``configure`` runs before the weights load (settings, layout checked against the model and the EP
size), ``bind`` after (observer and replica maps attached to the model's routers). The patches in
``patches`` ask ``current()`` for every decision; with the flag off it is ``NULL_PLUGIN``, whose
hooks pass straight through, so no patch checks "is the plugin on?" itself.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Protocol

from ...errors import SceneEplbError
from ...layouts.layout import Layout
from ...planning.model_geometry import ModelGeometry, from_hf_config
from ...protocol import startup_line
from ...runtime.config import kv_role_of, parse_config
from ...runtime.layout_check import layout_for_server
from ...runtime.worker.export import Exporter, group_maker
from ...runtime.worker.interfaces import LayerCapture, WorkerPlugin
from ...runtime.worker.load_audit import LoadAudit
from ...runtime.worker.observer import NullObserver
from ...runtime.worker.replica_map import SourceRanks, own_source_span
from ...runtime.worker.worker import NullPlugin, RecorderPlugin
from ..drafter import moe_drafter
from .draft_layers import drafter_model, hear_rows, placeable
from .expert_loading import MISLOAD_ENV, ExpertLoading, audit_load, misload
from .sequence_parallel import ShardRows, shard_rows_of
from .version import check_engine_version, engine_version

logger = logging.getLogger("vllm.scene_eplb")


class VllmPlugin(WorkerPlugin, Protocol):
    """What the vLLM patches call on this worker plugin: the step hooks, bind and control, and the
    decisions of the model's build (slots, layout rows, CPU support, MoE forward, router)."""

    @property
    def layout(self) -> Layout | None: ...

    def extra_slots(self, num_experts: int) -> int: ...

    @property
    def expert_loading(self) -> ExpertLoading | None: ...

    def cpu_support(self) -> bool: ...

    def opaque_moe_forward(self) -> bool: ...

    def needs_router(self) -> bool: ...


class VllmNullPlugin(NullPlugin):
    """The plugin off on this worker: no extra slots, no layout rows, no step work, control refused."""

    layout: Layout | None = None
    expert_loading: ExpertLoading | None = None

    def extra_slots(self, num_experts: int) -> int:
        return 0

    def cpu_support(self) -> bool:
        return False

    def opaque_moe_forward(self) -> bool:
        return False

    def needs_router(self) -> bool:
        return False


NULL_PLUGIN = VllmNullPlugin()


@dataclass(kw_only=True)
class VllmWorkerPlugin(RecorderPlugin):
    """A vLLM worker's plugin state: the recorder's, plus where its routed batch comes from."""

    dp_size: int
    tp_size: int
    source: SourceRanks  # the EP ranks that route this worker's batch (the static table's source rows)
    source_rank: int  # this worker's place in vLLM's EP group: its row of the per-source counts
    expert_loading: ExpertLoading | None = None  # the loaders' layout rows and the load audit's journal

    def source_ranks(self) -> list[int]:
        return [self.source.base, self.source.span]

    # ------------------------------------------------------------ hooks the patches call

    def extra_slots(self, num_experts: int) -> int:
        """Physical slots to add to each MoE layer beyond vLLM's own count (the layout's redundant ones)."""
        if self.layout is None:
            return 0
        if num_experts != self.layout.geometry.num_experts:
            raise SceneEplbError(
                f"a MoE layer has {num_experts} experts, the layout {self.layout.geometry.num_experts}", self.layout_path
            )
        return self.layout.geometry.num_redundant

    def cpu_support(self) -> bool:
        """The plugin's CPU support (local-only experts, DP collectives) is on for flagged servers."""
        return True

    def opaque_moe_forward(self) -> bool:
        """With DP > 1 the gathered token count differs per step and rank, which torch.compile cannot
        trace through vLLM's MoE code; vLLM's own opaque ``moe_forward`` op (its choice on GPUs)
        keeps the MoE layer out of the traced graph. On CPU only: elsewhere vLLM already uses it."""
        return self.dp_size > 1

    def needs_router(self) -> bool:
        """Under the flag every MoE layer must route through vLLM's router (its EPLB mapping step is
        where the replica map and the count run): vLLM 0.33 is asked for a decomposed backend."""
        return True

    # ------------------------------------------------------------ after load: bind to the model

    def bind(self, model_runner) -> None:
        """Attach the observer, the replica maps and the checks to the loaded model."""
        from vllm import envs

        from ...runtime.worker.replica_map import layer_maps  # torch: imported once the engine runs

        runners = moe_runners(model_runner.model)
        self.check_moe_layers([int(r.layer_id) for r in runners])
        drafter, drafter_runners = self.drafter_runners(model_runner)
        for r in runners + drafter_runners:
            check_moe_backend(r)
        shard = shard_rows_of(model_runner.model, runners, self.tp_rank, self.tp_size, bool(envs.VLLM_MOE_SKIP_PADDING))
        if shard is not None:
            # each TP rank routes its own chunk of the step: it counts that chunk (the export's sum
            # over the EP group counts every token once) and its own static table row routes it
            self.source, self.contributes = SourceRanks(self.source_rank, 1), True
            if drafter_runners:
                drafter_runners = self.uncounted_drafter(drafter_runners, "its MoE layers route TP chunks (sequence parallel)")
        if drafter_runners:
            self.bind_drafter_layers([int(r.layer_id) for r in drafter_runners])
        if self.expert_loading is not None:
            where = f"ep_rank {self.ep_rank}, dp_rank {self.dp_rank}, tp_rank {self.tp_rank}"
            try:
                self.load_audit = audit_load(self.expert_loading, runners + drafter_runners, where)
            except SceneEplbError as exc:
                bug = misload()
                if bug is None or not bug[1]:
                    raise
                logger.error("scene_eplb: %s (serving it anyway: the test-only %s asks to)", exc, MISLOAD_ENV)
                self.load_audit = LoadAudit(0, 0, None, refused=True)
            self.expert_loading = None  # the journal and tracer are done with: free them
        device = model_runner.device
        if self.layout is not None:
            maps = layer_maps(self.layout, self.config.dispatch, device, self.source)
            g = self.layout.geometry
            own = list(range(self.ep_rank * g.slots_per_rank, (self.ep_rank + 1) * g.slots_per_rank))
            for r in runners + drafter_runners:
                emap = r.routed_experts.expert_map
                if emap is None or emap.numel() != g.num_physical or (emap >= 0).nonzero().flatten().tolist() != own:
                    raise SceneEplbError(
                        f"layer {r.layer_id}: vLLM gave EP rank {self.ep_rank} the slots "
                        f"{None if emap is None else (emap >= 0).nonzero().flatten().tolist()} of "
                        f"{None if emap is None else emap.numel()}; the layout needs slots {own[0]}-{own[-1]} "
                        f"of {g.num_physical}"
                    )
                r.router._scene_eplb_map = maps[int(r.layer_id)]
        # the router's physical slot ids are counted (the measured replica traffic); logical counts
        # follow from them (without a layout the slots are the experts)
        import torch

        E, L = self.model.num_experts, len(runners)
        slots = (
            torch.as_tensor(self.layout.physical_to_logical_map[self.moe_layer_ids])
            if self.layout
            else torch.arange(E).expand(L, E)
        )
        # where several ranks route the same batch, each also counts the rows its own table row routes
        # with DP > 1 (or TP chunks) a rank counts its own rows, its experts compute every rank's: no active slots
        observer = self.make_observer(
            device, slots, self.dp_size, source_rows=self.source.span > 1, active_slots=self.dp_size == 1 and shard is None
        )
        # the largest pass a MoE layer routes (compiled, the capture cannot grow its ones buffer)
        batch = model_runner.vllm_config.scheduler_config.max_num_batched_tokens
        observer.reserve(batch * self.dp_size * (self.model.top_k or E))
        padding = padding_rows_of(model_runner)
        for idx, r in enumerate(runners):
            r.router._scene_eplb_physical = (
                functools.partial(_capture, observer, idx, padding, self.source, self.source_rank)
                if shard is None
                else functools.partial(_capture_chunk, observer, idx, shard)
            )
        if drafter_runners:
            self.bind_drafter_capture(drafter, drafter_runners, device)
        if self.config.time_moe:
            attach_moe_timer(observer, runners, device)
        logger.info("%s", startup_line(self.status(), f"ep_rank {self.ep_rank}, dp_rank {self.dp_rank}, tp_rank {self.tp_rank}"))

    # ------------------------------------------------------------ the speculative drafter's MoE layers

    def drafter_runners(self, model_runner) -> tuple[object, list]:
        """(the runner's drafter, its MoE runners in layer order); no runners where it has no model
        with MoE layers, or where they cannot be counted (said in the log; refused with a layout)."""
        drafter, model = drafter_model(model_runner)
        found = [] if model is None else moe_runners(model)
        if found and not placeable(drafter):
            found = self.uncounted_drafter(found, unplaceable(model_runner.vllm_config, drafter))
        return drafter, found

    def bind_drafter_layers(self, found: list[int]) -> None:
        """Keep the drafter's MoE layer ids; with a layout they must be its drafter rows."""
        if self.layout is not None and tuple(found) != self.layout.drafter_layers:
            raise SceneEplbError(
                f"the speculative drafter built MoE layers {found}, the layout has drafter rows "
                f"{list(self.layout.drafter_layers)}: fit the layout on a dump recorded with this drafter on",
                self.layout_path,
            )
        self.drafter_layer_ids = list(found)

    def uncounted_drafter(self, found: list, why: str) -> list:
        """The drafter's MoE layers left uncounted because ``why`` (nothing of them bound); a layout
        run refuses them, since it would leave them unplaced."""
        if self.layout is not None:
            raise SceneEplbError(f"scene_eplb.layout cannot place the speculative drafter's MoE layers: {why}", self.layout_path)
        logger.warning(
            "scene-eplb: the speculative drafter's MoE layers %s are not counted: %s", [r.layer_id for r in found], why
        )
        return []

    def bind_drafter_capture(self, drafter, runners: list, device) -> None:
        """The drafter's observer, stepped with the target's, counting the real rows vLLM tells its
        forwards (``draft_layers.DraftRows``)."""
        import torch

        E, D = self.model.num_experts, len(runners)
        slots = (
            torch.as_tensor(self.layout.physical_to_logical_map[self.drafter_layer_ids])
            if self.layout
            else torch.arange(E).expand(D, E)
        )
        observer = self.bind_drafter(self.drafter_layer_ids, device, slots, self.dp_size, source_rows=self.source.span > 1)
        rows = hear_rows(drafter, device)
        observer.reserve(rows.padding.shape[0] * (self.model.top_k or E))
        for idx, r in enumerate(runners):
            r.router._scene_eplb_physical = functools.partial(
                _capture, observer, idx, rows.padding, self.source, self.source_rank
            )


def _capture(observer: LayerCapture, moe_idx: int, padding, source: SourceRanks, source_rank: int, slots) -> None:
    """Count a MoE layer's slot ids [M, k] (padding rows left out) and, where the observer keeps
    them, the rows of them this rank routes itself (``source_rank``'s rows of ``source``); traceable."""
    observer.capture(moe_idx, slots, padding_rows=padding)
    if observer.source_rows:
        lo, hi = own_source_span(source, source_rank, slots.shape[0])
        observer.capture_sources(moe_idx, slots[lo:hi], None if padding is None else padding[lo:hi])


def _capture_chunk(observer: LayerCapture, moe_idx: int, shard: ShardRows, slots) -> None:
    """Count the real rows of this TP rank's chunk of the step (sequence-parallel MoE), read from the
    forward context's padding mask; a pass whose rows do not follow the chunk rule is marked skipped
    (status, dump metadata and the dump route's refusal show it), never miscounted."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    try:
        mask = get_forward_context().is_padding if is_forward_context_available() else None
        rows, padding = shard.own(slots.shape[0], mask)
    except ValueError as exc:
        logger.error("scene-eplb: this pass of MoE layer %d is not counted (skipped): %s", moe_idx, exc)
        observer.skip(moe_idx)
        return
    observer.capture(moe_idx, slots[:rows], padding_rows=padding)


def attach_moe_timer(observer, runners: list, device) -> None:
    """``time_moe``: time each MoE layer's local expert computation (its fused experts' ``apply``,
    between dispatch and combine). On CPU the local-only expert op times itself (host wall clock); on
    CUDA device timestamps around ``apply`` (``runtime.worker.device_timer``), which CUDA graphs replay."""
    experts = [fused_experts_of(r) for r in runners]
    for r, e in zip(runners, experts):
        if e is None:
            raise SceneEplbError(f"layer {r.layer_id}: time_moe found no fused experts to time in this build")
    if str(device) == "cpu":
        for idx, e in enumerate(experts):
            e._scene_eplb_timed_layer = idx
        return
    if len({id(e) for e in experts}) != len(experts):
        raise SceneEplbError("time_moe: MoE layers share one fused-experts object, so their times cannot be told apart")
    from ...runtime.worker.device_timer import DeviceMoeTimer

    try:
        timer = DeviceMoeTimer(len(runners), device)  # before any graph capture: replays keep its buffers
    except SceneEplbError as exc:
        raise SceneEplbError(f"scene_eplb.time_moe on {device}: {exc.problem}: remove it from --additional-config") from exc
    for idx, e in enumerate(experts):
        e.apply = timer.timed(idx, e.apply)
    observer.attach_device_timer(timer)


_current: VllmPlugin = NULL_PLUGIN


def current() -> VllmPlugin:
    """This worker plugin: a VllmWorkerPlugin when the flag is on, else the null plugin."""
    return _current


def configure(vllm_config, drafter=None) -> VllmPlugin:
    """Read and check the plugin settings and layout against the model (and the runner's speculative
    ``drafter``, None where it has none), before weights load."""
    global _current
    cfg = parse_config(vllm_config.additional_config)
    if cfg is None:
        _current = NULL_PLUGIN
        return _current
    check_engine_version()
    pc = vllm_config.parallel_config
    if pc.pipeline_parallel_size > 1:
        raise SceneEplbError("scene_eplb supports pipeline_parallel_size 1 only (each PP stage would need its own export)")
    role = cfg.resolve_role(kv_role_of(vllm_config))
    model = from_hf_config(vllm_config.model_config.hf_config.to_dict(), vllm_config.model_config.model)
    from vllm.distributed import get_ep_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    ep = get_ep_group()
    tp_rank, tp_size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    ep_size = ep.world_size if pc.enable_expert_parallel else 1  # the EP size a layout must be made for
    ep_rank = ep.rank_in_group if pc.enable_expert_parallel else 0
    check_parallel_settings(pc)
    check_moe_kernel(vllm_config.kernel_config)
    # DP rank d's tokens are routed by its TP ranks, EP ranks d*tp .. d*tp+tp-1 (vLLM's numbering; the
    # EP group holds every DP x TP rank, with EP on or off).
    group_rank = ep.rank_in_group
    source = SourceRanks(group_rank - tp_rank, tp_size)
    # The export sums over every rank of vLLM's EP group (DP x TP), which exists with or without EP.
    rt = VllmWorkerPlugin(
        config=cfg,
        role=role,
        engine=f"vllm {engine_version()}",
        model=model,
        model_name=str(vllm_config.model_config.model),
        ep_size=ep_size,
        ep_rank=ep_rank,
        dp_rank=pc.data_parallel_rank,
        dp_size=pc.data_parallel_size,
        tp_rank=tp_rank,
        tp_size=tp_size,
        source=source,
        source_rank=group_rank,
        contributes=tp_rank == 0,  # every TP rank where the MoE layers route TP chunks (set at bind)
        observer=NullObserver(role, cfg.ring_entries),
        exporter=Exporter(group_maker(ep.rank_in_group, ep.world_size)),
    )
    if cfg.layout:
        rt.layout, rt.layout_path = load_layout_for(cfg.layout, model, ep_size, pc), cfg.layout
        check_drafter(vllm_config, rt.layout, drafter)
    layers = () if rt.layout is None else rt.layout.moe_layers + rt.layout.drafter_layers
    rows = {layer: rt.layout.physical_to_logical_map[layer] for layer in layers} if rt.layout else {}
    rt.expert_loading = ExpertLoading(
        rows, model.num_experts, group=group_maker(ep.rank_in_group, ep.world_size) if ep_size > 1 else None
    )
    _current = rt
    return rt


def padding_rows_of(model_runner):
    """The runner's persistent padding-row mask [max tokens] (V1: ``is_padding``; Model Runner V2:
    ``input_buffers.is_padding``, all True during graph capture), or None."""
    mask = getattr(model_runner, "is_padding", None)
    return mask if mask is not None else getattr(getattr(model_runner, "input_buffers", None), "is_padding", None)


def check_parallel_settings(pc) -> None:
    """Refuse the parallel settings whose routed rows the observer cannot attribute (each needs its
    own padding mask, which vLLM does not hand the router): dual-batch overlap / micro-batching (the
    second micro-batch starts at an offset into the step's rows) and prefill context parallelism.
    Sequence-parallel MoE is counted chunk by chunk (``sequence_parallel``), decided at bind from
    the MoE layers vLLM built."""
    if pc.use_ubatching:
        raise SceneEplbError(
            "scene_eplb does not count micro-batched steps (the second micro-batch's padding rows are not "
            "the step's): drop --enable-dbo / --ubatch-size"
        )
    if pc.prefill_context_parallel_size > 1:
        raise SceneEplbError(
            "scene_eplb does not count prefill context parallelism (it gathers tokens over PCP ranks and keeps "
            "its own MoE padding): drop --prefill-context-parallel-size"
        )


def check_moe_kernel(kernel_config) -> None:
    """Refuse a MoE backend that builds no MoE layer the plugin can bind: MegaMoE
    (``--kernel-config moe_backend=deep_gemm_mega_moe``, DeepSeek-V4) routes inside its own experts
    (``DeepGemmMegaMoEExperts`` behind ``bf16_mega_gate``), with no MoE runner and no router step."""
    from vllm.config.kernel import NATIVE_MEGA_MOE_BACKENDS

    backend = kernel_config.moe_backend
    if backend in NATIVE_MEGA_MOE_BACKENDS:
        raise SceneEplbError(
            f"--kernel-config moe_backend={backend} (MegaMoE) routes inside its own experts, past vLLM's "
            "router, so scene_eplb's counts and replica map never run (a layout would compute the wrong "
            "experts, silently): choose another moe_backend or remove scene_eplb"
        )


CPU_EXPERTS_MODULE = "vllm.model_executor.layers.fused_moe.experts.cpu"  # vLLM's CPU experts: cpu_moe, cpu_int4_moe


def check_moe_backend(moe_runner) -> None:
    """Refuse a MoE layer the plugin cannot see into: a monolithic kernel routes inside itself, so
    the router's EPLB mapping step (the replica map and the count) never runs and, with a layout,
    logical ids would index physical slots (the wrong experts, silently); a quant method without
    EPLB support ignores physical ids; naive DP dispatch routes the DP-gathered batch on every rank
    (each would count every DP rank's tokens); quantized CPU experts (``CPUExpertsMxfp4``,
    ``CPUExpertsFp8``, ...) under expert parallelism hand their kernel global ids with no expert
    map (the plugin's local-experts path covers the unquantized ones only)."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    qm = moe_runner.routed_experts.quant_method
    experts = fused_experts_of(moe_runner)
    backend = qm.__class__.__name__ + ("" if experts is None else f" / {experts.__class__.__name__}")
    where = f"MoE layer {moe_runner.layer_id} ({getattr(moe_runner, 'layer_name', '?')}), backend {backend}"
    if qm.is_monolithic:
        raise SceneEplbError(
            f"{where}: a monolithic MoE kernel routes inside itself, so scene_eplb's replica map and counts "
            "never run there: choose a modular MoE backend (--moe-backend) or remove scene_eplb"
        )
    if not qm.supports_eplb:
        raise SceneEplbError(f"{where}: this quant method does not support EPLB (physical expert ids), which scene_eplb needs")
    if (
        experts is not None
        and type(experts).__module__.startswith(CPU_EXPERTS_MODULE)
        and not isinstance(experts, CPUUnquantizedExperts)
        and moe_runner.routed_experts.expert_map is not None
    ):
        raise SceneEplbError(
            f"{where}: vLLM's quantized CPU experts pass global expert ids to their kernel with no expert "
            "map, so under expert parallelism every rank would compute the wrong experts (scene_eplb's "
            "local-experts path covers unquantized CPU experts only): serve without --enable-expert-parallel "
            "or with unquantized experts"
        )
    if getattr(moe_runner, "do_naive_dispatch_combine", False):
        raise SceneEplbError(
            f"{where}: naive DP dispatch routes the DP-gathered batch on every rank, which scene_eplb would "
            "count once per DP rank: use a backend with a modular kernel (its dispatch follows routing)"
        )


def unplaceable(vllm_config, drafter) -> str:
    """Why this vLLM cannot count or place ``drafter``'s MoE layers, naming the method, the proposer
    and the version: its forwards do not tell EPLB their real rows."""
    method = vllm_config.speculative_config.method
    name = "Model Runner V2's drafter" if drafter is None else type(drafter).__name__
    return (
        f"the {method} drafter on vLLM {engine_version()} ({name}) does not tell EPLB the real rows of its forwards "
        "as vLLM's SpecDecodeBaseProposer does, so scene_eplb can neither count nor place its MoE layers"
    )


def check_drafter(vllm_config, layout: Layout, drafter) -> None:
    """Refuse a layout run whose speculative drafter has MoE layers of its own (DeepSeek's MTP layer,
    a DeepSeek-V4 DSpark draft) that the layout cannot place: vLLM builds the drafter's MoE layers
    with the layout's slot count, so they must load and route by rows of their own, the layout's
    ``drafter_layers`` (bind checks they are the layers the drafter built), and the drafter must be
    one whose real rows the plugin hears (``draft_layers.placeable``). Drafts without a model
    (n-gram, suffix) and dense drafters need nothing."""
    method = moe_drafter(vllm_config)
    if method is None:
        return
    if not placeable(drafter):
        raise SceneEplbError(
            f"scene_eplb.layout with a speculative drafter that has MoE layers: {unplaceable(vllm_config, drafter)}"
        )
    if not layout.drafter_layers:
        raise SceneEplbError(
            f"scene_eplb.layout with a speculative drafter that has MoE layers ({method}): the layout has no rows for "
            "them, and vLLM would build them with the layout's slot count but load and route them by no layout "
            "row: fit the layout on a dump recorded with the drafter on (or with `scene-eplb fit --drafter-layers N`), "
            "or serve it with n-gram drafts or none"
        )


def load_layout_for(path: str, model: ModelGeometry, ep_size: int, pc) -> Layout:
    """Read ``path`` and refuse it unless it fits this model and this server's parallel geometry."""
    if not pc.enable_expert_parallel:
        raise SceneEplbError("scene_eplb.layout needs --enable-expert-parallel (a layout places experts on EP ranks)")
    if pc.enable_eplb:
        raise SceneEplbError("scene_eplb.layout and --enable-eplb both move experts: use one of them")
    if pc.enable_ep_weight_filter:
        raise SceneEplbError("scene_eplb.layout needs every rank to read all expert tensors: drop --enable-ep-weight-filter")
    if pc.expert_placement_strategy != "linear":
        raise SceneEplbError("scene_eplb.layout needs --expert-placement-strategy linear (rank r owns slots [r*S, (r+1)*S))")
    return layout_for_server(path, model, ep_size, model_layer_axis=True)  # slots are looked up by model layer index


def fused_experts_of(moe_runner):
    """The fused-experts object a MoE layer's kernel runs (whose ``apply`` the CPU path wraps), or None."""
    kernel = getattr(moe_runner.routed_experts.quant_method, "moe_kernel", None)
    return getattr(kernel, "fused_experts", None) or getattr(getattr(kernel, "impl", None), "fused_experts", None)


def moe_runners(model) -> list:
    """The model's MoE runners in layer order."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runners = [m for m in model.modules() if isinstance(m, MoERunner)]
    return sorted(runners, key=lambda r: r.layer_id)
