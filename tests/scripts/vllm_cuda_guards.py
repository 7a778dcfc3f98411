"""What keeps a CUDA server from counting or computing the wrong experts, under the vLLM release on the path (tests/engine/test_vllm_cuda_guards.py).

Prints one JSON object."""

from __future__ import annotations

import functools
import inspect
import json
from types import SimpleNamespace
from typing import Any

import torch
import vllm

from vllm_scene_eplb.adapters.vllm import check_engine_version, patches, register, version_supported, worker_plugin
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.runtime.worker.observer import RoutingObserver
from vllm_scene_eplb.runtime.worker.worker import RecorderPlugin


def main() -> None:
    out = {"version": vllm.__version__}
    check_engine_version()  # the running release passes
    out["gate"] = [version_supported(v) for v in ("0.32.0", "0.33.0", "0.33.0+cu130", "0.31.0", "0.34.0", "0.32.1")]
    register()

    # ---- the hooks the V1 runner uses, with the parameters the patches read
    from vllm.distributed.eplb.eplb_state import EplbState
    from vllm.model_executor.layers.fused_moe import layer as layer_mod
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.fused_moe.router.base_router import BaseRouter
    from vllm.model_executor.layers.fused_moe.router.fused_moe_router import FusedMoERouter
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def params(fn):
        return list(inspect.signature(inspect.unwrap(fn)).parameters)

    out["hooks"] = {
        "determine_expert_counts": params(layer_mod.determine_expert_counts),
        "get_expert_mapping": params(RoutedExperts.get_expert_mapping),
        "build_initial_global_physical_to_logical_map": params(EplbState.build_initial_global_physical_to_logical_map),
        "_apply_eplb_mapping": params(BaseRouter._apply_eplb_mapping),
        "CPUUnquantizedExperts.apply": params(CPUUnquantizedExperts.apply),
        "_select_forward": params(MoERunner._select_forward),
        "execute_model": params(GPUModelRunner.execute_model),
        "eplb_step": params(GPUModelRunner.eplb_step),
        "_dummy_run": params(GPUModelRunner._dummy_run),
        "load_model": params(GPUModelRunner.__dict__["load_model"]),
        "coordinate_batch_across_dp": params(gpu_model_runner.coordinate_batch_across_dp),
        "SpecDecodeBaseProposer.dummy_run": params(SpecDecodeBaseProposer.dummy_run),
        "SpecDecodeBaseProposer.set_eplb_state": params(SpecDecodeBaseProposer.set_eplb_state),
    }
    propose = inspect.getsource(SpecDecodeBaseProposer.propose)
    out["hook_attrs"] = {
        "runner.is_padding": "self.is_padding = " in inspect.getsource(GPUModelRunner.__init__),
        # every drafter forward of propose tells EPLB its real rows first (the plugin's DraftRows hears it)
        "proposer.tells_real_rows": propose.count("self.eplb_state.prepare_forward(") == propose.count("self.model(**"),
        "MoERunner.is_monolithic": isinstance(MoERunner.__dict__.get("is_monolithic"), property),
        "MoERunner.do_naive_dispatch_combine": isinstance(MoERunner.__dict__.get("do_naive_dispatch_combine"), property),
        "build_initial_map_is_static": isinstance(
            EplbState.__dict__["build_initial_global_physical_to_logical_map"], staticmethod
        ),
    }

    ROUTER_STANDIN = SimpleNamespace()  # the router object vLLM's router methods are called on
    ROUTER_STANDIN._scene_eplb_map = lambda ids: ids  # identity replica map: slots are experts

    # ---- refusals at bind, through vLLM's own quant method classes
    from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEExpertsMonolithic
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Method

    def moe_runner(qm):
        return SimpleNamespace(
            routed_experts=SimpleNamespace(quant_method=qm), layer_id=3, layer_name="model.layers.3.mlp.experts"
        )

    def refusal(qm):
        try:
            worker_plugin.check_moe_backend(moe_runner(qm))
        except SceneEplbError as exc:
            return str(exc)
        return None

    mono = object.__new__(UnquantizedFusedMoEMethod)
    mono.moe_kernel, mono.experts_cls = None, FusedMoEExpertsMonolithic  # vLLM reads is_monolithic from experts_cls
    no_eplb = object.__new__(MoeWNA16Method)
    no_eplb.moe_kernel = None
    modular = object.__new__(UnquantizedFusedMoEMethod)
    modular.moe_kernel = None
    out["refused"] = {"monolithic": refusal(mono), "no_eplb": refusal(no_eplb), "modular": refusal(modular)}

    # ---- vLLM's CPU experts behind their quant methods (quantized ones on AMX hosts), with EP (an expert map) and without
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUExpertsFp8, CPUExpertsMxfp4
    from vllm.model_executor.layers.quantization.fp8 import Fp8MoEMethod
    from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod

    def cpu_refusal(method_cls, experts_cls, ep: bool):
        qm = object.__new__(method_cls)
        qm.moe_kernel = SimpleNamespace(
            is_monolithic=False, fused_experts=object.__new__(experts_cls)
        )  # the kernel object: a stand-in
        runner = moe_runner(qm)
        runner.routed_experts.expert_map = torch.tensor([0, 1, -1, -1]) if ep else None
        try:
            worker_plugin.check_moe_backend(runner)
        except SceneEplbError as exc:
            return str(exc)
        return None

    out["cpu_experts"] = {
        "mxfp4_ep": cpu_refusal(Mxfp4MoEMethod, CPUExpertsMxfp4, True),
        "fp8_ep": cpu_refusal(Fp8MoEMethod, CPUExpertsFp8, True),
        "mxfp4_no_ep": cpu_refusal(Mxfp4MoEMethod, CPUExpertsMxfp4, False),
        "unquantized_ep": cpu_refusal(UnquantizedFusedMoEMethod, CPUUnquantizedExperts, True),
    }

    # ---- a layout beside DeepSeek-V4's MTP or DSpark drafter, which vLLM 0.33 registers with its own EPLB
    try:
        from vllm.v1.worker.gpu.eplb_utils import draft_model_supports_eplb
    except ImportError:  # vLLM 0.32: no DSpark
        draft_model_supports_eplb = None
    if draft_model_supports_eplb is not None:
        from transformers import DeepseekV4Config
        from vllm.v1.spec_decode.eagle import EagleProposer

        from vllm_scene_eplb.layouts.layout import Geometry, Layout, linear_map

        hf = DeepseekV4Config()
        draft_config = SimpleNamespace(hf_config=hf)  # vLLM's ModelConfig around the real HF config: a stand-in
        g = Geometry(hf.n_routed_experts, 0, 2)
        layers = hf.num_hidden_layers
        target_only, with_rows = Layout(linear_map(g, layers), g), Layout(linear_map(g, layers + 1), g, drafter_layers=(layers,))
        # the drafter the V1 runner builds for each method (unbuilt: object.__new__); V1 builds none for DSpark
        built = {"mtp": object.__new__(EagleProposer), "dspark": None, "ngram": None}
        out["drafters"] = {}
        for method in ("mtp", "dspark", "ngram"):
            spec = SimpleNamespace(method=method, draft_model_config=draft_config)
            refused: dict[str, str | None] = {}
            for name, layout in (("target_only", target_only), ("with_rows", with_rows)):
                try:
                    worker_plugin.check_drafter(SimpleNamespace(speculative_config=spec), layout, built[method])
                    refused[name] = None
                except SceneEplbError as exc:
                    refused[name] = str(exc)
            # object(): the draft's MoE model, which vLLM's rule only needs to exist
            out["drafters"][method] = {"vllm_eplb": draft_model_supports_eplb(spec, object()), "refused": refused}

    # ---- MegaMoE (DeepSeek-V4's --kernel-config moe_backend=deep_gemm_mega_moe), refused by name before the weights load
    from vllm.config.kernel import KernelConfig

    def kernel_refusal(backend: str):
        try:
            worker_plugin.check_moe_kernel(KernelConfig(moe_backend=backend))
        except SceneEplbError as exc:
            return str(exc)
        return None

    out["mega_moe"] = {"deep_gemm_mega_moe": kernel_refusal("deep_gemm_mega_moe"), "auto": kernel_refusal("auto")}

    # ---- vLLM 0.33: the flag asks for a decomposed backend (layer.py reads the router's property)
    if hasattr(FusedMoERouter, "supports_monolithic_kernels"):
        prop = BaseRouter.supports_monolithic_kernels  # the (patched) property every router inherits
        off = prop.fget(ROUTER_STANDIN)
        worker_plugin._current = SimpleNamespace(needs_router=lambda: True)  # a stand-in plugin
        on = prop.fget(ROUTER_STANDIN)
        worker_plugin._current = worker_plugin.NULL_PLUGIN
        src = inspect.getsource(layer_mod)
        out["decomposed"] = [off, on, "not router.supports_monolithic_kernels" in src]

    # ---- vLLM 0.33: MoNE expert substitution (real parser, a model config that declares it) with a layout
    if hasattr(layer_mod, "make_expert_substitution"):
        mone_config = SimpleNamespace(
            hf_text_config=SimpleNamespace(approximate_experts={"3": [1, 2]}), hf_config=SimpleNamespace()
        )
        args = (mone_config, "model.layers.3.mlp.experts", 8, 64, torch.float32)
        plain = layer_mod.make_expert_substitution(*args)  # the flag off: vLLM's own answer
        worker_plugin._current = SimpleNamespace(layout=object())  # a worker plugin with a layout loaded
        try:
            layer_mod.make_expert_substitution(*args)
            mone = None
        except SceneEplbError as exc:
            mone = str(exc)
        worker_plugin._current = worker_plugin.NULL_PLUGIN
        out["mone"] = {"substituted": plain is not None, "refused": mone}

    # ---- vLLM 0.33: the Model Runner V2 hooks the patches read
    from vllm.v1.worker.gpu import eplb_utils as v2_eplb
    from vllm.v1.worker.gpu import input_batch as v2_input
    from vllm.v1.worker.gpu import model_runner as v2_module

    if hasattr(v2_eplb.EPLBController, "suppress"):
        out["v2_hooks"] = {
            "execute_model": params(v2_module.GPUModelRunner.execute_model)[:3],
            "step": params(v2_eplb.EPLBController.step),
            "dispatch_returns_dp_state": "num_tokens_across_dp" in inspect.getsource(v2_module.DPSyncState),
            "input_buffers_is_padding": "self.is_padding" in inspect.getsource(v2_input),
            "dummy_run_enters_execute_model": "self.execute_model(" in inspect.getsource(v2_module.GPUModelRunner._dummy_run),
            "runner_steps_eplb": inspect.getsource(v2_module).count("@step_eplb_after("),
            "pcp_size_in_config": "prefill_context_parallel_size" in inspect.getsource(type(vllm.config.ParallelConfig())),
        }

    # ---- warm-up passes: a skip_eplb _dummy_run of 64 tokens, then one real step of 10 tokens (top-2)
    TOP_K = 2

    def forward(num_tokens):
        ids = torch.arange(num_tokens * TOP_K).reshape(num_tokens, TOP_K) % 8
        BaseRouter._apply_eplb_mapping(ROUTER_STANDIN, ids)

    class RunnerStandIn(GPUModelRunner):
        # the real signatures; the bodies run one forward and end the step where the real ones do
        @functools.wraps(inspect.unwrap(GPUModelRunner._dummy_run))
        def _dummy_run(self, num_tokens, *args, skip_eplb=False, is_profile=False, **kwargs):
            forward(num_tokens)
            if not skip_eplb:
                self.eplb_step(is_dummy=True, is_profile=is_profile)

        @functools.wraps(inspect.unwrap(GPUModelRunner.execute_model))
        def execute_model(self, scheduler_output, *args, **kwargs):
            forward(scheduler_output.total_num_scheduled_tokens)

        def sample_tokens(self):
            self.eplb_step()

        def eplb_step(self, is_dummy=False, is_profile=False):
            pass

    def live_after_warmup(guarded):
        cls: Any = type("RunnerStandIn", (RunnerStandIn,), {})
        if guarded:
            patches._patch_dummy_run(cls)
            patches._patch_step(cls)
        else:  # the same steps with only the step boundary wired
            eplb, execute = cls.eplb_step, cls.execute_model

            def eplb_step(self, is_dummy=False, is_profile=False, eplb=eplb):
                out = eplb(self, is_dummy, is_profile)
                worker_plugin.current().end_step(is_dummy)
                return out

            def execute_model(self, so, *a, execute=execute, **k):
                worker_plugin.current().begin_step(so.total_num_scheduled_tokens)
                return execute(self, so, *a, **k)

            cls.eplb_step, cls.execute_model = eplb_step, execute_model
        obs = RoutingObserver(1, 8, 4)
        rt: Any = object.__new__(RecorderPlugin)  # a runtime with only its observer
        rt.observer = obs
        worker_plugin._current = rt
        ROUTER_STANDIN._scene_eplb_physical = functools.partial(obs.capture, 0)
        obs.start()
        runner: Any = object.__new__(cls)
        runner._dummy_run(5)  # a DP dummy step: ends a (dummy) step, counts nothing
        runner._dummy_run(64, skip_eplb=True, is_profile=True)  # FlashInfer autotune's warm-up: ends no step
        runner.execute_model(SimpleNamespace(total_num_scheduled_tokens=10))
        runner.sample_tokens()
        obs.stop()
        worker_plugin._current = worker_plugin.NULL_PLUGIN
        live, rec = obs.live_counts(), obs.snapshot()
        assert live is not None  # observing: the live totals are kept
        return {"live": int(live.logical.sum()), "ring": int(rec.logical.sum()), "passes": rec.passes}

    out["warmup"] = {"guarded": live_after_warmup(True), "unguarded": live_after_warmup(False)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
