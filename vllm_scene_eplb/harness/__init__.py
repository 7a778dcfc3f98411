"""The A/B harness and the engine test rig, kept apart from the pure core:

- ``results``: scenes, metrics, per-run summaries and result files (pure);
- ``bench``: one scene through vLLM's own ``vllm bench serve`` (imports vLLM);
- ``compare``: deltas between two results, with the field report's refusals and warnings (pure);
- ``local_server``: start and drive local vLLM CPU servers (tests, demo, benchmarks);
- ``tiny_model``: generate the tiny random Qwen3-MoE they serve;
- ``demo``: the main job end to end (record, fit, restart, A/B).
"""
