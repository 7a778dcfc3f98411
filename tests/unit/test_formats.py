import json

import numpy as np
import pytest
import torch  # the test set-up installs it: .pt is SGLang's recorder format

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.fit import FitOptions, fit
from vllm_scene_eplb.formats import OWN_FORMAT, GeometryHint, format_name, read_counts, read_layout, write_counts, write_layout
from vllm_scene_eplb.formats.vllm_ascend import expert_map_doc
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.layouts.layout import Geometry

from ..conftest import skewed_counts


@pytest.fixture
def counts():
    data = skewed_counts(4, 5, 16, seed=1)
    data[:, 0] = 0  # a dense layer
    return Counts(data, {"model": "tiny", "role": "prefill", "moe_layers": [1, 2, 3, 4]})


@pytest.fixture
def layout(counts):
    return fit(counts, FitOptions(Geometry(16, 4, 4, 2)))


@pytest.mark.parametrize("fmt", ["scene-eplb", "sglang", "pt"])
def test_counts_round_trip(tmp_path, counts, fmt):
    path = write_counts(counts, tmp_path / f"c.{ {'scene-eplb': 'npz', 'sglang': 'json', 'pt': 'pt'}[fmt] }", fmt)
    back = read_counts(path)
    assert (back.data == counts.data).all() and back.data.dtype == np.int64
    if fmt == "scene-eplb":
        assert back.meta["model"] == "tiny" and back.meta["moe_layers"] == [1, 2, 3, 4]
        assert back.meta["entries_written"] == 4


def test_reads_sglang_recorder_dump_pt(tmp_path):
    data = torch.tensor(skewed_counts(3, 2, 8), dtype=torch.int32)
    torch.save({"rank": 0, "logical_count": data, "average_utilization_rate_over_window": None}, tmp_path / "dump.pt")
    c = read_counts(tmp_path / "dump.pt")
    assert c.data.shape == (3, 2, 8) and (c.data == data.numpy()).all()


def test_native_counts_checksum_catches_tampering(tmp_path, counts):
    path = write_counts(counts, tmp_path / "c.npz")
    with np.load(path) as z:
        data, meta = z["logical_count"].copy(), z["meta"]
    data[0, 1, 0] += 1
    np.savez(tmp_path / "bad.npz", logical_count=data, meta=meta)
    with pytest.raises(SceneEplbError, match="checksum mismatch"):
        read_counts(tmp_path / "bad.npz")


@pytest.mark.parametrize("fmt", ["scene-eplb", "sglang", "vllm-ascend", "pt"])
def test_layout_round_trip(tmp_path, layout, fmt):
    path = write_layout(layout, tmp_path / f"l.{'pt' if fmt == 'pt' else 'json'}", fmt)
    back = read_layout(path, GeometryHint(ep_size=4, num_experts=16, num_nodes=2))
    rows = list(layout.moe_layers) if fmt == "vllm-ascend" else slice(None)
    assert (back.physical_to_logical_map == layout.physical_to_logical_map[rows]).all()
    assert back.geometry == layout.geometry
    if fmt == "scene-eplb":
        assert back.moe_layers == layout.moe_layers and back.meta["fingerprint"] == layout.meta["fingerprint"]
        assert back.digest() == layout.digest()


def test_sglang_layout_has_no_extra_keys(tmp_path, layout):
    doc = json.loads(write_layout(layout, tmp_path / "s.json", "sglang").read_text())
    assert list(doc) == ["physical_to_logical_map"]
    assert np.array(doc["physical_to_logical_map"]).shape == (5, 20)


def test_ascend_export_lists_moe_layers_per_rank_in_order(layout):
    doc = expert_map_doc(layout)
    assert doc["moe_layer_count"] == 4 and len(doc["layer_list"]) == 4
    first = doc["layer_list"][0]["device_list"]
    assert len(first) == 4 and all(len(d["device_expert"]) == 5 for d in first)
    assert sum((d["device_expert"] for d in first), []) == layout.physical_to_logical_map[1].tolist()


def test_native_layout_checksum_catches_edits(tmp_path, layout):
    path = write_layout(layout, tmp_path / "l.json")
    doc = json.loads(path.read_text())
    row = doc["physical_to_logical_map"][1]
    row[0], row[-1] = row[-1], row[0]  # still a valid map, but not the one written
    path.write_text(json.dumps(doc))
    with pytest.raises(SceneEplbError, match="checksum mismatch"):
        read_layout(path)


def test_bare_layout_needs_ep_size(tmp_path, layout):
    path = write_layout(layout, tmp_path / "s.json", "sglang")
    with pytest.raises(SceneEplbError, match="--ep-size"):
        read_layout(path)


def test_native_layout_refuses_another_geometry(tmp_path, layout):
    path = write_layout(layout, tmp_path / "l.json")
    with pytest.raises(SceneEplbError, match="ep_size 4, but 8"):
        read_layout(path, GeometryHint(ep_size=8))


def test_write_is_atomic_on_failure(tmp_path, counts, monkeypatch):
    target = tmp_path / "c.npz"

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", boom)
    with pytest.raises(SceneEplbError, match="c.npz: cannot write: disk full"):
        write_counts(counts, target)
    assert list(tmp_path.iterdir()) == []


def test_native_layout_carries_the_fitted_static_table(tmp_path):
    """The fitted table (static_sources) survives a round trip, is in the layout hash, and a file
    whose table was changed (checksum recomputed) no longer matches its recorded hash."""
    from vllm_scene_eplb.fileio import doc_checksum

    layout = fit(Counts(skewed_counts(1, 2, 16, seed=8)), FitOptions(Geometry(16, 8, 8), dispatch="static"))
    assert layout.static_sources is not None
    path = write_layout(layout, tmp_path / "l.json")
    back = read_layout(path)
    assert (back.static_sources == layout.static_sources).all() and back.digest() == layout.digest()
    doc = json.loads(path.read_text())
    doc["static_sources"] = [[ep if s == ep else 1 for s in row] for row, ep in zip(doc["static_sources"], [8, 8])]
    doc["checksum"] = doc_checksum(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(SceneEplbError, match="static_sources|layout_hash"):
        read_layout(path)


def test_native_the_own_formats_old_name_still_names_it(tmp_path, counts):
    """The glossary gave "native" to the engines' own counters; files and commands written with the old
    name keep working: ``native`` reads as ``scene-eplb`` wherever a format is chosen."""
    assert format_name("native") == OWN_FORMAT == "scene-eplb"
    a = write_counts(counts, tmp_path / "a.npz", "native")
    b = write_counts(counts, tmp_path / "b.npz", OWN_FORMAT)
    assert a.read_bytes() == b.read_bytes()
    with pytest.raises(SceneEplbError, match="unknown counts format 'nativ'; choose one of scene-eplb, sglang, pt"):
        write_counts(counts, tmp_path / "c.npz", "nativ")
