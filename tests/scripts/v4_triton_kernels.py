"""The Triton kernel stand-ins of ``tests/v4_standin/v4_triton.py`` against vLLM's released kernels, run by
Triton's interpreter through vLLM's own launchers, case by case (tests/engine/test_v4_stand_ins.py).

Runs with ``TRITON_INTERPRET=1`` in its environment (Triton builds its own language helpers for the
interpreter when it is imported, so the switch must be on before vLLM imports it) and
``tests/v4_standin`` on its path. Each case launches the same inputs once with the released kernel
(vLLM's source, compiled by the real ``triton.jit`` in interpreter mode) and once with the stand-in,
and prints one JSON object: case -> {"same": the outputs equal, "released", "stand_in": the outputs}.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import types
from collections.abc import Callable
from types import SimpleNamespace

import torch
import v4_stand_ins
import v4_triton


def interpreted(fn: types.FunctionType):
    """vLLM's released Triton kernel ``fn`` (the bare function vLLM's placeholder ``triton.jit`` kept)
    compiled by the real ``triton.jit``: run on CPU tensors by Triton's interpreter, with the
    ``triton.jit`` helpers it calls from its module (one namespace for all: the interpreter patches the
    kernel's globals for the helpers' calls too)."""
    import triton
    import triton.language as tl

    namespace = dict(fn.__globals__, tl=tl, triton=triton)
    pending, seen = [fn], {fn.__name__}
    while pending:
        for name in pending.pop().__code__.co_names:
            helper = fn.__globals__.get(name)
            if isinstance(helper, types.FunctionType) and helper.__module__ == fn.__module__ and name not in seen:
                seen.add(name)
                pending.append(helper)
                namespace[name] = triton.jit(types.FunctionType(helper.__code__, namespace, name, helper.__defaults__))
    return triton.jit(types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__))


@contextlib.contextmanager
def kernel_as(module_name: str, holder: str, kernel):
    """vLLM's launchers run ``kernel`` for the kernel ``holder`` names while inside."""
    before = v4_stand_ins.kernel_of(module_name, holder)
    assert isinstance(before, types.FunctionType), f"{holder} is no longer vLLM's Triton placeholder: {before!r}"
    v4_stand_ins.set_kernel(module_name, holder, kernel)
    try:
        yield before
    finally:
        v4_stand_ins.set_kernel(
            module_name, holder, staticmethod(before) if isinstance(_owner(module_name, holder), type) else before
        )


def _owner(module_name: str, holder: str):
    return getattr(importlib.import_module(module_name), holder)


def a_batch(block_size: int = 4, prefill=(7, 13), prefixes=(20, 5, 0, 3), padding: int = 3, seed: int = 0) -> SimpleNamespace:
    """A scheduled step as vLLM lays it out: two decodes first, then the prefills; query_start_loc,
    seq_lens, a block table of distinct blocks, each token's position and slot, and ``padding``
    padded rows (slot -1) after the real tokens."""
    gen = torch.Generator().manual_seed(seed)
    query_lens = torch.tensor([1, 1, *prefill])
    prefix = torch.tensor(prefixes)
    seq_lens = (prefix + query_lens).to(torch.int32)
    qsl = torch.cat((torch.zeros(1, dtype=torch.int64), query_lens.cumsum(0))).to(torch.int32)
    columns = int(seq_lens.max()) // block_size + 2
    table = torch.randperm(len(query_lens) * columns + 7, generator=gen)[: len(query_lens) * columns].view(-1, columns)
    req = torch.repeat_interleave(torch.arange(len(query_lens)), query_lens)
    positions = torch.cat([torch.arange(int(p), int(p) + int(q)) for p, q in zip(prefix, query_lens)])
    slots = table[req, positions // block_size] * block_size + positions % block_size
    return SimpleNamespace(
        qsl=qsl,
        seq_lens=seq_lens,
        table=table.to(torch.int32),
        req=req,
        slots=torch.cat((slots, torch.full((padding,), -1))),
        num_tokens=int(query_lens.sum()),
        num_decodes=2,
        num_decode_tokens=2,
        num_prefills=len(prefill),
        padding=padding,
    )


def token_to_request() -> list[torch.Tensor]:
    from vllm.v1.attention.ops.metadata import compute_token_to_req_indices

    b = a_batch()
    out = torch.full((b.num_tokens + 9,), -7, dtype=torch.int32)
    compute_token_to_req_indices(b.qsl, out, b.num_tokens, b.num_tokens + 5)
    return [out]


def sliding_window(has_image: bool) -> list[torch.Tensor]:
    from vllm.v1.attention.backends.mla.sparse_swa import _COMPUTE_SWA_INDICES_AND_LENS_KERNEL as launch

    b = a_batch()
    total = b.num_tokens + b.padding
    token_to_req = torch.cat((b.req, torch.zeros(b.padding, dtype=torch.int64))).to(torch.int32)
    replay = torch.tensor([0, 2, 0, 1], dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    left = torch.randint(0, 9, (total,), dtype=torch.int32, generator=gen)
    right = torch.randint(0, 3, (total,), dtype=torch.int32, generator=gen)
    window, width = 6, 9
    indices = torch.full((total, 1, width), -9, dtype=torch.int32)
    lens = torch.full((total,), -9, dtype=torch.int32)
    for n, offset in ((b.num_decode_tokens, 0), (total - b.num_decode_tokens, b.num_decode_tokens)):
        launch(indices[offset:].view(-1, width), lens[offset:], window, width, left, right, b.qsl, b.seq_lens, token_to_req,
               b.slots >= 0, b.table, 4, replay, num_tokens=n, token_offset=offset, has_image=has_image)  # fmt: skip
    return [indices, lens]


def prefill_gather_lengths() -> list[torch.Tensor]:
    from vllm.v1.attention.backends.mla.sparse_swa import _COMPUTE_PREFILL_METADATA_KERNEL as launch

    b = a_batch()
    out = torch.full((b.num_prefills,), -9, dtype=torch.int32)
    launch(out, b.seq_lens, b.qsl, torch.tensor([0, 0, 0, 2], dtype=torch.int32), b.num_prefills, b.num_decodes, 6)
    return [out]


def compressed_slots(ratio: int) -> list[torch.Tensor]:
    from vllm.v1.attention.backends.mla.compressor_utils import get_compressed_slot_mapping

    b = a_batch(prefixes=(300, 127, 0, 250), prefill=(7, 140))
    slots = b.slots.clone()
    slots[4] = -1  # a replayed token: cached already, its compressed state too
    out = torch.full((b.num_tokens + 5,), -9, dtype=torch.int64)
    get_compressed_slot_mapping(b.num_tokens, slots, b.qsl, b.seq_lens, b.table, 2, ratio, out=out)
    return [out]


def prefill_chunks(dcp: int) -> list[torch.Tensor]:
    from vllm.v1.attention.backends.mla.indexer import build_prefill_chunk_metadata

    b = a_batch(prefixes=(30, 9, 0, 17))
    compressed = (b.seq_lens // 4).to(torch.int32)
    out = []
    for query_slice in (None, slice(3, 11)):
        m = build_prefill_chunk_metadata(
            b.num_decodes, b.num_decodes + b.num_prefills, b.qsl, b.qsl, b.seq_lens, compressed, compressed, b.table, 4,
            query_slice=query_slice, dcp_rank=dcp - 1, dcp_world_size=dcp, cp_kv_cache_interleave_size=1,
        )  # fmt: skip
        assert m is not None
        out += [m.cu_seqlen_ks, m.cu_seqlen_ke, m.token_to_seq]
    return out


METADATA = "vllm.v1.attention.ops.metadata"
SPARSE_SWA = "vllm.v1.attention.backends.mla.sparse_swa"
COMPRESSOR = "vllm.v1.attention.backends.mla.compressor_utils"
INDEXER = "vllm.v1.attention.backends.mla.indexer"
# case -> (the kernel's module, its holder in ``v4_triton.KERNELS``, a launch through vLLM's launcher)
CASES: dict[str, tuple[str, str, Callable[[], list[torch.Tensor]]]] = {
    "token-to-request": (METADATA, "_token_request_mapping_kernel", token_to_request),
    "sliding-window": (SPARSE_SWA, "ComputeSWAIndicesAndLensKernel", lambda: sliding_window(False)),
    "sliding-window-image": (SPARSE_SWA, "ComputeSWAIndicesAndLensKernel", lambda: sliding_window(True)),
    "prefill-gather-lengths": (SPARSE_SWA, "ComputePrefillMetadataKernel", prefill_gather_lengths),
    "compressed-slots-c4": (COMPRESSOR, "CompressedSlotMappingKernel", lambda: compressed_slots(4)),
    "compressed-slots-c128": (COMPRESSOR, "CompressedSlotMappingKernel", lambda: compressed_slots(128)),
    "prefill-chunks": (INDEXER, "BuildPrefillChunkMetadataKernel", lambda: prefill_chunks(1)),
    "prefill-chunks-dcp2": (INDEXER, "BuildPrefillChunkMetadataKernel", lambda: prefill_chunks(2)),
}


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    stand_ins = {(module, holder): impl for module, holder, impl in v4_triton.KERNELS}
    out = {}
    for case, (module, holder, run) in CASES.items():
        raw = v4_stand_ins.kernel_of(module, holder)
        with kernel_as(module, holder, interpreted(raw)):
            released = run()
        with kernel_as(module, holder, v4_triton.GridKernel(raw, stand_ins[(module, holder)])):
            standing = run()
        same = all(torch.equal(a, b) for a, b in zip(released, standing, strict=True))
        out[case] = {
            "kernel": holder,
            "same": same,
            "released": [t.tolist() for t in released],
            "stand_in": [t.tolist() for t in standing],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
