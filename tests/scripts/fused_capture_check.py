"""The CUDA capture's one Triton kernel (``runtime.worker.fused_capture``) against the four torch ops
it replaces, on CPU tensors run by Triton's interpreter (``TRITON_INTERPRET=1`` in the environment:
tests/unit/test_runtime_torch.py): every mask mode, int32 and int64 ids, ids out of range.

Prints: whether the counts are equal, the ids counted, the ids left to the not-counted column."""

from __future__ import annotations

import torch

from vllm_scene_eplb.runtime.worker import fused_capture
from vllm_scene_eplb.runtime.worker.id_space import IdSpace
from vllm_scene_eplb.runtime.worker.pass_counts import PassCounts


def main() -> None:
    space = IdSpace(4, 16, "cpu", None)
    fused, ops = PassCounts(4, space, "cpu"), PassCounts(4, space, "cpu")
    assert not fused.fused  # on CPU the torch ops count; the kernel is forced here
    fused_capture.warm("cpu", space.width)  # every variant, on a scratch row: the pass buffers stay clear
    assert int(fused.counts.abs().sum()) == 0
    fused.fused = True
    g = torch.Generator().manual_seed(0)
    for m in (1, 7, 64, 300):
        ids = torch.randint(-3, space.width + 4, (m, 8), generator=g)  # -1, ids past W and below -1: not counted
        mask = torch.rand(m + 5, generator=g).lt(0.3)
        for layer, (pad, own) in enumerate(((None, None), (mask, None), (None, mask), (None, None))):
            for c in (fused, ops):
                c.capture(layer, ids if layer < 3 else ids.to(torch.int32), pad, own)
    print(torch.equal(fused.counts, ops.counts), int(ops.counts[:, :16].sum()), int(ops.counts[:, 16].sum()))


if __name__ == "__main__":
    main()
