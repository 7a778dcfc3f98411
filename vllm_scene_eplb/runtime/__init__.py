"""Engine-neutral runtime pieces both adapters share (no inference engine imported):

- ``interfaces``: the protocols the adapters call (step hooks, observer, layer capture, worker plugin);
- ``observer``: the routing observer, composed of ``id_space``, ``pass_counts`` (the traced capture),
  ``count_ring`` (the recorder's device ring buffer), ``live_totals``, ``skipped_passes`` and
  ``moe_timing``, and the null observer where it is off (torch);
- ``replica_map``: logical -> physical ids inside the forward pass (torch);
- ``device_timer``: per-layer MoE time from GPU timestamps that CUDA graphs replay (torch, Triton);
- ``export``: the integer SUM of the counts over a Gloo group, rank 0 writes one file (torch);
- ``layout_check``: the startup check of ``scene_eplb.layout`` against the model and EP size (pure);
- ``worker``: one worker's recorder state and control actions (start, stop, dump, status, live);
- ``http_routes``: the HTTP routes of an API server and their API-key check (FastAPI);
- ``fanout``: one control action on every worker behind an API server, the dump's polling (pure);
- ``live_poller``: the live-fitness window of an API server: every rank's counts, scored (pure);
- ``metrics``: live fitness as Prometheus gauges on the server's ``/metrics``.
"""
