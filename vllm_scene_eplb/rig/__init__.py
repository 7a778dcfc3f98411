"""The engine test rig, kept apart from the product (no product module imports it):

- ``local_server``: start and drive local vLLM CPU servers (tests, demo, benchmarks);
- ``server_zygote``: a test session's pre-imported Python that forks each server's API server;
- ``tiny_model``, ``tiny_deepseek``, ``tiny_deepseek_v4``, ``modelslim``: the generated models they serve;
- ``simulated``: a simulated server for calibrating ``advise``; ``pair_load``: a closed-loop P/D load;
- ``demo``: the main job end to end (record, fit, restart, A/B);
- ``step_delay``, ``step_delay_worker``: the test-only step delay and its way into a vLLM worker.
"""
