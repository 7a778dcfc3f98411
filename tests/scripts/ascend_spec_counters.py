"""The tokens a decode load runs against what the engine's counters say, on the released schedulers
(tests/ascend/test_ascend_recipes.py: ``verify.sh``'s totals bound with the MTP drafter on).

Arguments: the D recipe's command line after the module (its --model a tiny V4 W8A8, without its KV
connector: no P to pull from) as JSON. For each speculative-token count K (0: the drafter off) and each
of sync and async scheduling, the engine config is built by vLLM's own parser and
``create_engine_config`` on vLLM-Ascend's platform, and the load (requests of mixed prompt lengths and
``max_tokens``, ignoring EOS) is driven through vLLM 0.23's ``Scheduler`` / ``AsyncScheduler`` and
vLLM-Ascend 0.23.0.post1's ``RecomputeScheduler`` / ``AsyncRecomputeScheduler`` as ``EngineCore``
drives them (``step``, with ``post_step``'s drafts; ``step_with_batch_queue``'s queue of 2). Only the
model runner's answer is made here: a drafter whose drafts are accepted at random, each request's
first token after its prompt. Prints one JSON object: per case the tokens the scheduler scheduled
(what the target's MoE layers run), the counters ``vllm_scene_eplb.ab.engine_tokens`` reads, and the
least and most tokens a request ran above its own share of the counters' floor.
"""

from __future__ import annotations

import json
import random
import sys
from collections import deque


def _config(argv: list[str], spec_tokens: int, async_scheduling: bool):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = [a for a in argv if a != "--async-scheduling"]
    at = args.index("--speculative-config")
    del args[at : at + 2]
    if spec_tokens:
        args += [
            "--speculative-config",
            json.dumps({"method": "mtp", "num_speculative_tokens": spec_tokens, "enforce_eager": True}),
        ]
    args.append("--async-scheduling" if async_scheduling else "--no-async-scheduling")
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
    return AsyncEngineArgs.from_cli_args(parsed).create_engine_config()


def _run(scheduler_cls, vc, spec_tokens: int, async_scheduling: bool, seed: int) -> dict:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import FinishReason
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    rng = random.Random(seed)
    block = vc.cache_config.block_size
    spec = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=4096, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
    vc.cache_config.num_gpu_blocks = kv.num_blocks  # what EngineCore sets once it has sized the cache
    sched = scheduler_cls(
        vllm_config=vc,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=block,
        log_stats=True,
    )
    prompts = {}
    for i in range(48):
        prompt = [rng.randrange(10, 1000) for _ in range(rng.randrange(3, 300))]
        params = SamplingParams(max_tokens=rng.randrange(1, 40), ignore_eos=True)
        prompts[f"r{i}"] = len(prompt)
        sched.add_request(Request(f"r{i}", prompt, params, None))
    fed = dict.fromkeys(prompts, 0)  # tokens scheduled so far (a prompt is done once they reach its length)
    counted = {"scheduled": 0, "generated": 0, "finished": 0, "by_length": 0, "drafts": 0, "accepted": 0}
    # each request's own: tokens scheduled, and the floor's terms of it (drafts verified while it was live)
    own = {rid: {"scheduled": 0, "generated": 0, "drafts": 0, "accepted": 0} for rid in prompts}

    def answer(out) -> tuple[ModelRunnerOutput, dict]:
        ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        verified: dict[str, tuple[int, int]] = {}
        for rid in ids:
            fed[rid] += out.num_scheduled_tokens[rid]
            own[rid]["scheduled"] += out.num_scheduled_tokens[rid]
            drafts = len(out.scheduled_spec_decode_tokens.get(rid, ()))
            if fed[rid] - drafts < prompts[rid]:
                sampled.append([])  # a prompt chunk: nothing sampled
                continue
            accepted = 0
            while accepted < drafts and rng.random() < 0.6:
                accepted += 1
            sampled.append([rng.randrange(10, 1000) for _ in range(1 + accepted)])
            verified[rid] = (drafts, accepted)
        output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled)
        return output, verified

    def update(out) -> None:
        counted["scheduled"] += out.total_num_scheduled_tokens
        output, verified = answer(out)
        for rid, (drafts, accepted) in verified.items():
            request = sched.requests.get(rid)
            if request is not None and not request.is_finished():  # what update_from_output counts
                own[rid]["drafts"], own[rid]["accepted"] = own[rid]["drafts"] + drafts, own[rid]["accepted"] + accepted
        for eco in sched.update_from_output(out, output).values():
            for o in eco.outputs:
                counted["generated"] += len(o.new_token_ids)
                own[o.request_id]["generated"] += len(o.new_token_ids)
                if o.finish_reason is not None:
                    counted["finished"] += 1
                    counted["by_length"] += o.finish_reason == FinishReason.LENGTH
            stats = eco.scheduler_stats.spec_decoding_stats if eco.scheduler_stats else None
            if stats is not None:
                counted["drafts"] += stats.num_draft_tokens
                counted["accepted"] += stats.num_accepted_tokens

    queue: deque = deque()
    while sched.has_requests() or queue:
        if not async_scheduling:  # EngineCore.step, then post_step's drafts for what is still running
            out = sched.schedule()
            update(out)
            if spec_tokens:
                running = [r.request_id for r in sched.running if fed[r.request_id] >= prompts[r.request_id]]
                drafts = [[rng.randrange(10, 1000) for _ in range(spec_tokens)] for _ in running]
                sched.update_draft_token_ids(DraftTokenIds(running, drafts))
            continue
        if sched.has_requests():  # step_with_batch_queue: fill the queue of 2 before waiting on a result
            queue.appendleft(sched.schedule())
            if len(queue) < 2 and sched.has_requests():
                continue
        update(queue.pop())
    excess = [o["scheduled"] - (prompts[r] + o["generated"] - 1 - o["accepted"] + o["drafts"]) for r, o in own.items()]
    return {**counted, "prompt": sum(prompts.values()), "requests": len(prompts), "request_excess": [min(excess), max(excess)]}


def main() -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm_ascend.core.recompute_scheduler import AsyncRecomputeScheduler, RecomputeScheduler

    argv = json.loads(sys.argv[1])
    out = {}
    for spec_tokens in (0, 1, 2, 3):
        for async_scheduling, classes in (
            (False, (Scheduler, RecomputeScheduler)),
            (True, (AsyncScheduler, AsyncRecomputeScheduler)),
        ):
            vc = _config(argv, spec_tokens, async_scheduling)
            for cls in classes:
                for seed in range(3):
                    out[f"{cls.__name__} K{spec_tokens} seed{seed}"] = _run(cls, vc, spec_tokens, async_scheduling, seed)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
