"""Each recipe's configuration through the released engine code's own checks (tests/ascend/test_ascend_recipes.py).

Arguments: the recipes (JSON: name -> kv, extra, dp, tp, env, and optionally model, argv and scene) and the
model folder. Prints one JSON object, a verdict per recipe. Each recipe runs on a fresh vLLM-Ascend config
(its own reset) with its environment, restored after it; the connector's own module gives the worker checked.
A recipe with ``argv`` (the server's whole command line after the module, its --model the check's model) is
also parsed by vLLM's own ``api_server`` argument parser and built by ``AsyncEngineArgs.create_engine_config``
on vLLM-Ascend's platform (what it makes of the scheduling and drafter flags, and the timeouts vLLM reads from
the recipe's environment, reported); with ``scene`` (``prompt`` tokens, ``max_tokens`` requested) its request goes
through vLLM's own length checks: the completion request's ``TokenizeParams`` and the engine's
``InputProcessor._validate_prompt_len``."""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from types import SimpleNamespace


def _full(r: dict) -> dict:
    """The recipe's whole command line through vLLM's parser and engine config, and its scene's request
    through vLLM's length checks (None where it passes, else the error)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.input_processor import InputProcessor

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(r["argv"])
    vc = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    from vllm import envs

    spec, scheduler = vc.speculative_config, vc.scheduler_config.scheduler_cls
    full = {
        "max_model_len": vc.model_config.max_model_len,
        "prefix_caching": vc.cache_config.enable_prefix_caching,
        "block_size": vc.cache_config.block_size,
        "quantization": vc.model_config.quantization,
        # what the engine runs of the recipe's scheduling and drafter flags, and the timeouts vLLM reads
        "async_scheduling": vc.scheduler_config.async_scheduling,
        "scheduler_cls": str(getattr(scheduler, "__name__", scheduler)).rsplit(".", 1)[-1],
        "speculative": None if spec is None else [spec.method, spec.num_speculative_tokens, spec.enforce_eager],
        "execute_model_timeout": envs.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS,
        "reads_rpc_timeout": "VLLM_RPC_TIMEOUT" in envs.environment_variables,  # the tutorial sets it too
    }
    scene = r.get("scene")
    if scene:
        tokens = [1] * scene["prompt"]
        try:
            request = CompletionRequest(model="scene", prompt=tokens, max_tokens=scene["max_tokens"])
            request.build_tok_params(vc.model_config).apply_post_tokenization(None, {"prompt_token_ids": tokens})
            engine = SimpleNamespace(skip_prompt_length_check=False, model_config=vc.model_config, supports_mm_inputs=False)
            InputProcessor._validate_prompt_len(engine, scene["prompt"], "decoder")
            full["scene_refused"] = None
        except ValueError as exc:  # vLLM's VLLMValidationError is one
            full["scene_refused"] = f"{type(exc).__name__}: {exc}"[:400]
    return full


def main() -> None:
    logging.basicConfig(level=logging.INFO)  # a server configures this; a bare script must, to see the config hook's line
    import vllm_scene_eplb.adapters.entry as entry

    entry.register()
    from vllm import envs
    from vllm.config import KVTransferConfig, ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm_ascend.ascend_config import clear_ascend_config, get_ascend_config
    from vllm_ascend.distributed.kv_transfer import register_connector
    from vllm_ascend.utils import enable_dsa_cp, enable_sp

    register_connector()
    recipes, model = json.loads(sys.argv[1]), sys.argv[2]
    out = {}
    environ = dict(os.environ)
    for name, r in recipes.items():
        os.environ.clear()
        os.environ.update({**environ, **r.get("env", {})})
        clear_ascend_config()  # vLLM-Ascend's own reset of its config, enable_sp() and enable_dsa_cp()
        vars(envs).pop("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", None)  # what its platform set for the last recipe: read anew
        try:
            kv = KVTransferConfig(**r["kv"])
            connector = KVConnectorFactory.get_connector_class(kv)
            worker = object.__new__(sys.modules[connector.__module__].MooncakeConnectorWorker)
            worker._get_prefill_decode_size(SimpleNamespace(kv_transfer_config=kv))
            if worker._prefill_tp_size < worker._decode_tp_size:  # the worker's __init__ check, after the call above
                raise ValueError("prefill_tp_size must be >= decode_tp_size")
            pc = ParallelConfig(data_parallel_size=r["dp"], tensor_parallel_size=r["tp"], enable_expert_parallel=True)
            vc = VllmConfig(
                model_config=ModelConfig(model=r.get("model", model)),
                parallel_config=pc,
                kv_transfer_config=kv,
                additional_config=r["extra"],
            )
            ascend = get_ascend_config()
            with set_current_vllm_config(vc):  # DSA-CP raises here without FlashComm1
                sp = [enable_sp(vc), enable_dsa_cp(), bool(ascend.enable_shared_expert_dp)]
            full = _full(r) if "argv" in r else {}
            out[name] = {
                **full,
                "ok": True,
                "connector": connector.__name__,
                "connector_module": connector.__module__.rsplit(".", 1)[-1],
                "sp": sp,
                "kv_role": vc.kv_transfer_config.kv_role,
                "kv_port": int(vc.kv_transfer_config.kv_port),
                "dynamic_eplb": ascend.eplb_config.dynamic_eplb,
                "prefill_mc2": ascend.enable_prefill_mc2,
                # the tutorial D's keys as vLLM-Ascend's AscendConfig read them (its platform drops the first on P)
                "recompute_scheduler": ascend.recompute_scheduler_enable,
                "shared_expert_overlap": ascend.multistream_overlap_shared_expert,
                "expert_map_path": (vc.additional_config.get("eplb_config") or {}).get("expert_map_path"),
            }
        except BaseException as exc:
            traceback.print_exc()
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
