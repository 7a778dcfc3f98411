"""/metrics pages as vLLM 0.23's own ``PrometheusStatLogger`` writes them, around a load's prefix-cache
stats (tests/ascend/test_collect_warm.py).

Arguments: the model folder, then the cases (JSON: name -> [[hits, queries] per DP engine]). For each
case a fresh logger of two DP engines (vLLM's ``engine`` label 0 and 1) on that model's config writes its
page, records each engine's step stats (``SchedulerStats.prefix_cache_stats``: the load's queried and hit
tokens), and writes its page again. Prints one JSON object: case -> [before, after] (Prometheus text).
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from prometheus_client import REGISTRY, generate_latest
    from vllm.config import ModelConfig, VllmConfig
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats

    model, cases = sys.argv[1], json.loads(sys.argv[2])
    config = VllmConfig(model_config=ModelConfig(model=model))
    out = {}
    for name, engines in cases.items():
        logger = PrometheusStatLogger(config, engine_indexes=list(range(len(engines))))  # unregisters the last one's
        before = generate_latest(REGISTRY).decode()
        for engine, (hits, queries) in enumerate(engines):
            stats = SchedulerStats(prefix_cache_stats=PrefixCacheStats(requests=1, queries=queries, hits=hits))
            logger.record(stats, None, engine_idx=engine)
        out[name] = [before, generate_latest(REGISTRY).decode()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
