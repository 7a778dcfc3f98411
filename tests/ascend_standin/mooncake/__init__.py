"""A STAND-IN for Mooncake's ``mooncake`` package (the KV transfer engine), for tests without it.

Mooncake's wheel links RDMA and Ascend transport libraries this machine does not have. vLLM-Ascend's
``MooncakeConnectorV1`` imports ``mooncake.engine.TransferEngine`` at module import; this stand-in lets
the tests import that real module and run its config-reading code (``_get_prefill_decode_size``).
Nothing here moves KV: constructing a ``TransferEngine`` raises.
"""
