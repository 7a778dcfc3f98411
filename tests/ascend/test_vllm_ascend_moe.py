"""The plugin inside vLLM-Ascend's MoE forward, run through its real released code on CPU.

Each test runs a script under ``tests/ascend_env``: real vLLM 0.23.0 and vLLM-Ascend 0.23.0.post1,
with only ``torch_npu`` replaced by the stand-in in ``tests/ascend_standin``. No NPU kernel is
reached: ``select_experts`` is called with sigmoid scores without renormalisation, which its fused
kernel does not take (``check_npu_moe_gating_top_k``), so it runs its plain-torch path
``_native_select_experts``; on a 910C the kernel path returns the same kind of ids to the same hook.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from vllm_scene_eplb.adapters.vllm_ascend.moe_hooks import SELECT_EXPERTS_BINDERS, SELECT_EXPERTS_SOURCE
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import write_layout
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.dispatch import dynamic_tables
from vllm_scene_eplb.layouts.layout import Geometry

from ..ascend_env import fetch_sdist, run
from ..conftest import skewed_counts

pytestmark = pytest.mark.engine

E, EP, N_MOE = 8, 2, 2


def test_every_module_that_binds_select_experts_is_rebound():
    """The sdist's A2/A3 modules that import select_experts by name are exactly our binders (this
    fails when a vLLM-Ascend release binds it somewhere new), and after install() none of the loaded
    vllm_ascend modules holds the original."""
    root = fetch_sdist()
    found = {SELECT_EXPERTS_SOURCE}
    for path in (root / "vllm_ascend").rglob("*.py"):
        rel = path.relative_to(root).with_suffix("")
        if "_310p" in rel.parts:  # Ascend 310P inference cards: their own selector, not 910C
            continue
        for block in re.findall(r"from\s+[\w.]+\s+import\s+(\([^)]*\)|[^\n]*)", path.read_text()):
            if re.search(r"\bselect_experts\b", block):
                found.add(".".join(rel.parts))
    assert found == set(SELECT_EXPERTS_BINDERS)
    out = run("ascend_select_binders")
    assert set(SELECT_EXPERTS_BINDERS) <= set(out["rebound"]) and out["holding"] == []
    assert out["forward_impl_wrapped"] and out["not_double_wrapped"] and out["again"] == out["rebound"]


@pytest.fixture(scope="module")
def dynamic_run(tmp_path_factory):
    """A layout fitted for dynamic dispatch (EP=2, R=2) on the tiny Qwen3-MoE, run through vLLM-Ascend."""
    from vllm_scene_eplb.rig.tiny_model import TinyMoeSpec, make_tiny_moe

    root = tmp_path_factory.mktemp("ascend-dynamic")
    model = make_tiny_moe(root / "model", TinyMoeSpec())
    layout = fit(Counts(skewed_counts(2, N_MOE, E, top_k=2)), FitOptions(Geometry(E, 2, EP), dispatch="dynamic"))
    path = write_layout(layout, root / "layout.json")
    rows = run("ascend_dynamic", model, path, root / "dump", E, EP, N_MOE)
    return layout, rows


def test_dynamic_dispatch_splits_each_experts_rows_over_its_replicas(dynamic_run):
    """Through every module's real select_experts and vLLM-Ascend's own log2phy indexing: each
    (row, expert) lands on replica row mod c of that expert, on every rank; weights are untouched;
    outside a MoE layer the ids are the logical ones."""
    layout, rows = dynamic_run
    moe = list(layout.moe_layers)
    l2p, replicas = dynamic_tables(layout.physical_to_logical_map[moe], E)
    assert len(rows) == N_MOE * EP * len(SELECT_EXPERTS_BINDERS)
    for row in rows:
        k = row["k"]
        logical, phys = np.array(row["logical"]), np.array(row["phys"])
        want = l2p[k][logical, np.arange(len(logical))[:, None] % replicas[k][logical]]
        assert (phys == want).all(), row["module"]
        assert (layout.physical_to_logical_map[moe[k]][phys] == logical).all()
        assert row["same_weights"] and row["outside_unchanged"]
        assert row["log2phy_len"] == E * replicas[k].max()
    replicated = np.flatnonzero(replicas[0] > 1)
    assert replicated.size  # the layout does replicate, and the split uses every replica
    used = {
        p
        for row in rows
        if row["k"] == 0
        for lg, ph in zip(np.ravel(row["logical"]), np.ravel(row["phys"]))
        if lg in replicated
        for p in [ph]
    }
    assert used == set(l2p[0][replicated][l2p[0][replicated] >= 0].tolist())


def test_forward_impl_wrapper_names_the_layer_being_run():
    from vllm_scene_eplb.adapters.vllm_ascend.moe_hooks import _wrap_forward_impl, current_layer

    seen = _wrap_forward_impl(lambda self, *a: (self, current_layer.get()))
    layer = object()
    assert seen(layer, 1) == (layer, layer) and current_layer.get() is None
