"""What runs in the API server process:

- ``http_routes``: the HTTP routes of an API server and their API-key check (FastAPI);
- ``fanout``: one control action on every worker behind an API server, the dump's polling (pure);
- ``live_poller``: the live-fitness window of an API server: every rank's counts, scored (pure);
- ``metrics``: live fitness as Prometheus gauges on the server's ``/metrics``;
- ``node_flow``: the node's flow from the engine's own per-step stats (P supply, D demand).
"""
