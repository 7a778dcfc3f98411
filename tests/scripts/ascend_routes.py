"""The routes on vLLM 0.23's API server, each reaching every DP engine (tests/ascend/test_vllm_ascend_recorder.py).

Argument: the model folder. Prints one JSON object."""

from __future__ import annotations

import asyncio
import json
import sys
from types import SimpleNamespace
from typing import Any

import fastapi
import httpx
import torch
import vllm.entrypoints.openai.api_server as api
from ascend_worker import prefill_plugin

import vllm_scene_eplb.adapters.entry as entry


def main() -> None:
    model_dir = sys.argv[1]
    entry.register()  # the Ascend adapter, as in vLLM 0.23's API server process
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_scene_eplb.adapters.vllm_ascend.routes import AscendEndpoints
    from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

    extra = {"scene_eplb": {"role": "prefill", "ring_entries": 4}}
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", model_dir, "--additional-config", json.dumps(extra)])
    app = api.build_app(args, ("generate",))  # the wrapped build_app: our routes join vLLM's app
    paths = sorted(r.path for r in app.routes if "expert_distribution" in r.path or "scene_eplb" in r.path)
    workers = [prefill_plugin(extra, model_dir, d, 2) for d in range(2)]  # two DP engines of one worker each

    class EngineCoreStandIn:  # vLLM's engine-core client: one utility call per engine
        core_engines = [b"\x00\x00", b"\x01\x00"]

        async def _call_utility_async(self, method, rpc, timeout, rpc_args, kwargs, engine):
            assert (method, rpc, timeout) == ("collective_rpc", "scene_eplb_control", None)
            return [workers[self.core_engines.index(engine)].control(*rpc_args)]

    async def serve():
        client = SimpleNamespace(engine_core=EngineCoreStandIn())
        ours = AscendEndpoints(("0.23.0.post1", "0.23.0"))
        await ours.init_state(client, SimpleNamespace(), args)
        ours.attach_router(app2 := fastapi.FastAPI())
        out: dict[str, Any] = {"paths": paths}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app2), base_url="http://t") as http:
            out["status"] = (await http.get("/scene_eplb/status")).json()
            out["start"] = (await http.post("/start_expert_distribution_record")).status_code
            for rt in workers:
                assert isinstance(rt.observer, RoutingObserver)  # make_observer bound it
                rt.observer.capture(0, torch.tensor([[0, 1]]))
                rt.end_step(False)
            out["again"] = (await http.post("/start_expert_distribution_record")).json()
            out["stop"] = (await http.post("/stop_expert_distribution_record")).json()
            out["native"] = (await http.get("/scene_eplb/native_load")).json()
            out["recorded"] = [int(rt.observer.snapshot().logical.sum()) for rt in workers]
            # a record in which DP rank 1 skipped a layer's pass: the dump is refused, unless asked to keep it
            await http.post("/start_expert_distribution_record")
            workers[1].observer.skip(0)
            workers[1].end_step(False)
            await http.post("/stop_expert_distribution_record")
            out["skipped_status"] = (await http.get("/scene_eplb/status")).json()
            refused = await http.post("/dump_expert_distribution_record")
            out["refused"] = [refused.status_code, refused.json()["error"]]
            bad = await http.post("/dump_expert_distribution_record?keep_skipped=maybe")
            out["bad_flag"] = bad.status_code
            out["flag_elsewhere"] = (await http.post("/start_expert_distribution_record?keep_skipped=true")).status_code
            kept = await http.post("/dump_expert_distribution_record?keep_skipped=true")
            out["kept"] = [kept.status_code, kept.json().get("error", "")]
        print(json.dumps(out))

    asyncio.run(serve())


if __name__ == "__main__":
    main()
