"""What runs in a vLLM worker process:

- ``interfaces``: the protocols the adapters call (step hooks, observer, layer capture, worker plugin);
- ``observer``: the routing observer, composed of ``id_space``, ``pass_counts`` (the traced capture),
  ``count_ring`` (the recorder's device ring buffer), ``live_totals``, ``skipped_passes``,
  ``moe_timing``, ``run_queue`` and ``slot_activity``, and the null observer where it is off (torch);
- ``replica_map``: logical -> physical ids inside the forward pass (torch);
- ``device_timer``: per-layer MoE time from GPU timestamps that CUDA graphs replay (torch, Triton);
- ``export``: the integer SUM of the counts over a Gloo group, rank 0 writes one file (torch);
- ``load_audit``, ``load_journal``: the audit of the expert weights a worker loaded;
- ``worker``: one worker's recorder state and control actions (start, stop, dump, status, live);
- ``step_hook``: a hook point inside every real engine step, a no-op unless a test installs one.
"""
