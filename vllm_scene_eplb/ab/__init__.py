"""The A/B harness (pure but ``bench``):

- ``stats``: the one A/B statistics (the block model over rounds, its interval and verdicts);
- ``results``: scenes, metrics, per-run summaries and result files;
- ``bench``: one scene through vLLM's own ``vllm bench serve`` (imports vLLM);
- ``compare``: deltas between two results, with the field report's refusals and warnings;
- ``factorial``: the four-arm A/B; ``charts``: ratio charts;
- ``verify``: the PASS/FAIL checks of ``deploy/ascend-910c/verify.sh``.
"""
