"""Engine adapters: the only code that touches inference-engine internals, each behind a version check.

``entry.register`` (the ``vllm.general_plugins`` entry point) detects the engine once and hands over
to ``vllm`` (vLLM 0.32) or ``vllm_ascend`` (vLLM-Ascend 0.23.0.post1). The two never import each
other; what they share is engine-neutral and lives in ``vllm_scene_eplb.runtime``.
"""
