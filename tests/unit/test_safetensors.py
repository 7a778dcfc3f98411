"""The numpy-only safetensors reader: the same tensors the safetensors package reads, from one file or
a sharded checkpoint, and one line for each hostile file (never a crash, never a huge allocation)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.formats.safetensors import INDEX_FILE, read_checkpoint_tensors, read_header

TENSORS = {
    "a": np.arange(12, dtype=np.int32).reshape(3, 4),
    "b": np.arange(5, dtype=np.int64) - 2,
    "c": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3),
}


def _raw(path: Path, header: dict | bytes, data: bytes, length: int | None = None) -> Path:
    """A file of an 8-byte header length (``length``, else the header's), the header and ``data``."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return path


def test_reads_the_tensors_asked_for_as_the_safetensors_package_wrote_them(tmp_path):
    save_file(TENSORS, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    got = read_checkpoint_tensors(tmp_path, ["a", "c", "absent"])
    assert sorted(got) == ["a", "c"]
    for name in got:
        assert got[name].dtype == TENSORS[name].dtype and np.array_equal(got[name], TENSORS[name])
    assert read_header(tmp_path / "model.safetensors")["b"].shape == (5,)


def test_reads_a_sharded_checkpoint_through_its_weight_map(tmp_path):
    save_file({"a": TENSORS["a"]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": TENSORS["b"], "c": TENSORS["c"]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00002-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors",
    }
    (tmp_path / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    got = read_checkpoint_tensors(tmp_path, ["a", "b"])
    assert np.array_equal(got["a"], TENSORS["a"]) and np.array_equal(got["b"], TENSORS["b"])


def _good(tmp_path: Path) -> Path:
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    return tmp_path / "model.safetensors"


def _header_of(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _mutated(tmp_path: Path, change) -> Path:
    header, data = _header_of(_good(tmp_path))
    change(header)
    return _raw(tmp_path / "model.safetensors", header, data)


HOSTILE = {
    "shorter than its length field": (lambda p: p.write_bytes(b"\x10\0\0"), "shorter than the 8-byte header length"),
    "header longer than the file": (lambda p: _raw(p, {}, b"", length=1000), "header claims 1000 bytes"),
    "huge header length": (lambda p: _raw(p, b"{}", b"", length=2**63), "header claims"),
    "non-JSON header": (lambda p: _raw(p, b"{not json", b""), "not valid JSON"),
    "header not an object": (lambda p: _raw(p, b"[1, 2]", b""), "not a JSON object"),
    "truncated data": (lambda p: p.write_bytes(_good(p.parent).read_bytes()[:-7]), "outside the file's"),
    "offsets past the end": (
        lambda p: _mutated(p.parent, lambda h: h["b"].update(data_offsets=[0, 10**12])),
        "outside the file's",
    ),
    "offsets backwards": (lambda p: _mutated(p.parent, lambda h: h["a"].update(data_offsets=[8, 4])), "outside the file's"),
    "overlapping tensors": (
        lambda p: _mutated(
            p.parent, lambda h: h["b"].update(data_offsets=h["a"]["data_offsets"][:1] + [h["a"]["data_offsets"][0] + 40])
        ),
        "overlap",
    ),
    "wrong dtype size": (lambda p: _mutated(p.parent, lambda h: h["a"].update(dtype="I64")), "needs 96 bytes"),
    "negative dimension": (lambda p: _mutated(p.parent, lambda h: h["a"].update(shape=[-3, 4])), "not a list of sizes"),
    "entry not an object": (lambda p: _mutated(p.parent, lambda h: h.update(a=[1])), "not an object"),
    "no dtype": (lambda p: _mutated(p.parent, lambda h: h["a"].pop("dtype")), "no dtype"),
    "offsets not a pair": (lambda p: _mutated(p.parent, lambda h: h["a"].update(data_offsets=[0])), "not [begin, end]"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_file_is_one_line(tmp_path, name):
    make, expected = HOSTILE[name]
    path = tmp_path / "model.safetensors"
    make(path)
    with pytest.raises(SceneEplbError) as exc:
        read_checkpoint_tensors(tmp_path, ["a", "b"])
    assert expected in str(exc.value) and "\n" not in str(exc.value) and str(path) in str(exc.value)


def test_a_dtype_numpy_cannot_hold_is_named_only_when_read(tmp_path):
    save_file({"a": TENSORS["a"], "h": np.zeros(4, dtype=np.float16)}, str(tmp_path / "model.safetensors"))
    header, data = _header_of(tmp_path / "model.safetensors")
    header["h"]["dtype"] = "BF16"
    header["h"]["shape"] = [4]
    _raw(tmp_path / "model.safetensors", header, data)
    assert np.array_equal(read_checkpoint_tensors(tmp_path, ["a"])["a"], TENSORS["a"])
    with pytest.raises(SceneEplbError, match="'h' is BF16, which this reader does not decode"):
        read_checkpoint_tensors(tmp_path, ["h"])


@pytest.mark.parametrize(
    "weight_map, expected",
    [
        ({"a": "../model.safetensors"}, "not a file name in the folder"),
        ({"a": "missing.safetensors"}, "names this shard, which is missing"),
        ([1, 2], "weight_map must be an object"),
    ],
    ids=["path outside the folder", "missing shard", "not an object"],
)
def test_a_bad_index_is_one_line(tmp_path, weight_map, expected):
    _good(tmp_path)
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(SceneEplbError, match=expected):
        read_checkpoint_tensors(tmp_path, ["a"])


def test_a_folder_without_a_checkpoint_is_one_line(tmp_path):
    with pytest.raises(SceneEplbError, match="not a safetensors checkpoint folder"):
        read_checkpoint_tensors(tmp_path, ["a"])
