"""Engine-neutral runtime pieces both adapters share (no inference engine imported), by the process
they run in:

- ``worker/``: what runs in a vLLM worker process (the recorder, its observer and ring, the export,
  the load audit, the replica map, the device timer);
- ``server/``: what runs in the API server process (the HTTP routes, the fan-out to the workers, the
  live poller, the gauges, the node's flow);
- here, what both use: ``config`` (the plugin's settings) and ``layout_check`` (the startup check of
  ``scene_eplb.layout`` against the model and EP size, pure).
"""
