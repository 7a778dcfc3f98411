"""The layout core and the counts it is fitted to (numpy and the standard library, no torch, no
engine): ``counts``, ``layout`` (map, geometry, validation), ``dispatch`` (static and dynamic
tables), ``score``, ``evaluation`` (the one score table), ``scenes`` (several counts files in one
fit), ``vllm_policy`` (vLLM's default EPLB policy in numpy), ``peer`` (that policy beside a layout)
and ``report``."""
