"""What a layout or a server recipe costs before anything runs: ``model_geometry`` (the MoE
geometry and the attention shapes), ``memory`` (redundant slots in bytes and KV tokens), ``sizing``
(``scene-eplb preflight``) and ``step_cost`` (``scene-eplb screen``)."""
