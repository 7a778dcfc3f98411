"""Inputs that do not belong together are refused, each through its command's CLI: one line, exit 2,
nothing written. A `--model` that is not the counts' or the layout's; an output that is an input or
lies inside the `--model` folder; a record whose MoE layers are empty (DeepSeek-V4's hash layers
named with the `hash-counts --fill` line), unless `--allow-empty-layers`. And the routing groups `fit`
takes where neither `--model` nor the counts say: DeepSeek-V3's shape names its 8, said on stderr."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from vllm_scene_eplb.formats import read_counts, read_layout, write_counts
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, make_tiny_deepseek_v4

from ..conftest import DATA, skewed_counts
from .test_bad_input import assert_one_line_error, run

V3, V4 = "data/models/deepseek-v3", "data/models/deepseek-v4-flash"
P1024, P4096 = DATA / "prefill_in1024.json", DATA / "prefill_in4096.json"
FIT = ("--ep-size", "16", "--redundant", "16")


def _digest(folder: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(code: int, err: str, expected: str, where: Path, before: set, name: str) -> None:
    assert_one_line_error(code, err, expected, name)
    assert set(where.rglob("*")) == before, f"{name} wrote {set(where.rglob('*')) - before}"


@pytest.fixture(scope="module")
def v3_layout(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("v3") / "layout.json"
    code, _, err = run("fit", P4096, *FIT, "--model", V3, "-o", out, "-q")
    assert code == 0, err
    return out


# --- a --model that is not the inputs' ------------------------------------------------------------


def test_fit_refuses_a_model_with_other_layers_than_the_counts(tmp_path):
    """The field repro: DeepSeek-V3's counts priced and advised as DeepSeek-V4-Flash."""
    before = set(tmp_path.rglob("*"))
    code, out, err = run("fit", P1024, *FIT, "--model", V4, "-o", tmp_path / "l.json", "-q")
    _refused(
        code,
        err,
        "not counts of --model data/models/deepseek-v4-flash: the counts are [L=61, E=256], the model [L=43, E=256]",
        tmp_path,
        before,
        "fit",
    )
    assert not out


@pytest.mark.parametrize("command", ["inspect", "report", "advise", "validate"])
def test_every_command_that_takes_a_model_and_an_input_refuses_a_mismatch(tmp_path, v3_layout, command):
    cases = {
        "inspect": (("inspect", P1024, "--model", V4), "the counts are [L=61, E=256], the model [L=43, E=256]"),
        "report": (
            ("report", v3_layout, P1024, "--model", V4, "-o", tmp_path / "rep"),
            "layout has 58 MoE layers, the model has 43",
        ),
        "advise": (
            ("advise", P1024, "--layout", v3_layout, "--model", V4),
            "the counts are [L=61, E=256], the model [L=43, E=256]",
        ),
        "validate": (("validate", v3_layout, "--model", V4), "layout has 58 MoE layers, the model has 43"),
    }
    args, expected = cases[command]
    before = set(tmp_path.rglob("*"))
    code, out, err = run(*args, "-q")
    _refused(code, err, expected, tmp_path, before, command)
    assert "--model" in err and "verdict" not in out


def _v3_counts(path: Path, rows: list[int], meta: dict | None = None) -> Path:
    """DeepSeek-V3-shaped counts [2, 61, 256] routed in ``rows`` only."""
    data = np.zeros((2, 61, 256), dtype=np.int64)
    data[:, rows] = skewed_counts(2, len(rows), 256, seed=1) * 8
    return write_counts(Counts(data, meta or {}), path)


@pytest.mark.parametrize(
    "rows, meta, expected",
    [
        (list(range(61)), None, "the counts route layers [0, 1, 2] that the model says are dense"),
        (list(range(3, 61)), {"moe_layers": list(range(1, 61))}, "the counts' metadata names MoE layers [1, 2, 3"),
    ],
    ids=["a dense layer routed", "other MoE layers named"],
)
@pytest.mark.parametrize("command", ["fit", "inspect"])
def test_counts_of_the_models_shape_but_not_its_layers_are_refused(tmp_path, rows, meta, expected, command):
    counts = _v3_counts(tmp_path / "c.npz", rows, meta)
    before = set(tmp_path.rglob("*"))
    args = ("fit", counts, *FIT, "-o", tmp_path / "l.json") if command == "fit" else ("inspect", counts)
    code, _, err = run(*args, "--model", V3, "-q")
    _refused(code, err, expected, tmp_path, before, command)


# --- an output that is an input, or inside the model folder -----------------------------------------


@pytest.fixture(scope="module")
def tiny_v4(tmp_path_factory) -> Path:
    return make_tiny_deepseek_v4(tmp_path_factory.mktemp("tiny-v4"), TinyDeepseekV4Spec())


def _record(path: Path, spec: TinyDeepseekV4Spec, hashed: bool = False) -> Path:
    """A record of the tiny V4 (its hash layers empty unless ``hashed``), with the recorder's metadata."""
    data = skewed_counts(4, spec.num_layers, spec.num_experts, seed=2) * spec.top_k
    if not hashed:
        data[:, list(spec.hash_layers)] = 0
    return write_counts(Counts(data, {"model": "tiny", "moe_layers": list(spec.moe_layers)}), path)


@pytest.mark.parametrize("target", ["config.json", "model.safetensors", "new.npz"])
def test_hash_counts_never_writes_into_the_model(tmp_path, tiny_v4, target):
    (tmp_path / "ids.json").write_text(json.dumps([[1, 2, 3]]))
    record = _record(tmp_path / "record.npz", TinyDeepseekV4Spec())
    model_before, before = _digest(tiny_v4), set(tmp_path.rglob("*"))
    code, _, err = run(
        "hash-counts", "--model", tiny_v4, "--token-ids", tmp_path / "ids.json", "--fill", record, "-o", tiny_v4 / target, "-q"
    )
    _refused(code, err, f"output lies inside the --model folder {tiny_v4}", tmp_path, before, target)
    assert _digest(tiny_v4) == model_before


@pytest.mark.parametrize("model_arg", ["folder", "config.json"])
def test_fit_and_report_never_write_into_the_model(tmp_path, v3_layout, model_arg):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(Path(V3, "config.json").read_bytes())
    given = model if model_arg == "folder" else model / "config.json"
    before_model = _digest(model)
    code, _, err = run("fit", P1024, *FIT, "--model", given, "-o", model / "config.json", "-q")
    assert_one_line_error(code, err, "output lies inside the --model folder", "fit")
    code, _, err = run("report", v3_layout, P1024, "--model", given, "-o", model / "report", "-q")
    assert_one_line_error(code, err, "output lies inside the --model folder", "report")
    assert _digest(model) == before_model and not (model / "report").exists()


def test_hash_counts_refuses_to_replace_its_record(tmp_path, tiny_v4):
    (tmp_path / "ids.json").write_text(json.dumps([[1, 2, 3]]))
    record = _record(tmp_path / "record.npz", TinyDeepseekV4Spec())
    data = record.read_bytes()
    code, _, err = run(
        "hash-counts", "--model", tiny_v4, "--token-ids", tmp_path / "ids.json", "--fill", record, "-o", record, "-q"
    )
    assert_one_line_error(code, err, f"output would replace an input file ({record})", "hash-counts")
    assert record.read_bytes() == data


# --- empty MoE layers -----------------------------------------------------------------------------


def _v4_flash_record(path: Path, meta: dict | None = None) -> Path:
    """A DeepSeek-V4-Flash-shaped record [3, 43, 256] whose three hash layers came out empty (SGLang's
    JSON, as SGLang #25961 recorded it, or scene-eplb's with ``meta``)."""
    data = skewed_counts(3, 43, 256, seed=4) * 6
    data[:, :3] = 0
    if meta is None:
        path.write_text(json.dumps({"logical_count": data.tolist()}))
        return path
    return write_counts(Counts(data, meta), path)


@pytest.mark.parametrize(
    "source, meta, model",
    [
        ("--model", {}, V4),
        ("the counts' metadata", {"moe_layers": list(range(43))}, None),
        ("DeepSeek-V4-Flash's shape, 43 layers x 256 experts", None, None),
    ],
    ids=["--model", "metadata", "shape"],
)
def test_fit_refuses_a_v4_record_whose_hash_layers_are_empty(tmp_path, source, meta, model):
    record = _v4_flash_record(tmp_path / ("r.json" if meta is None else "r.npz"), meta)
    before = set(tmp_path.rglob("*"))
    code, out, err = run("fit", record, *FIT, "-o", tmp_path / "l.json", "-q", *(("--model", model) if model else ()))
    _refused(code, err, f"{record}: MoE layers [0, 1, 2] (per {source}) are all zero", tmp_path, before, source)
    fill = f"`scene-eplb hash-counts --model {model or 'DIR'} --fill {record} --token-ids TOKENS -o FILLED`"
    assert fill in err and "--allow-empty-layers" in err and not out


def test_allow_empty_layers_fits_them_to_an_even_load_and_says_so(tmp_path):
    record = _v4_flash_record(tmp_path / "r.json")
    code, out, err = run("fit", record, *FIT, "--model", V4, "-o", tmp_path / "l.json", "--allow-empty-layers", "-q")
    assert code == 0, err
    assert "MoE layers [0, 1, 2] have no counts in any scene" in out and "hash-counts --model" in out
    assert read_layout(tmp_path / "l.json").moe_layers == tuple(range(43))  # the model's, the empty ones included


def test_inspect_flags_empty_moe_layers_after_its_summary(tmp_path):
    record = _v4_flash_record(tmp_path / "r.json")
    code, out, err = run("inspect", record, "--model", V4, "--json", "-q")
    assert_one_line_error(code, err, "MoE layers [0, 1, 2] (per --model) are all zero", "inspect")
    summary = json.loads(out)
    assert summary["empty_moe_layers"] == [0, 1, 2] and summary["moe_layers_from"] == "--model"
    code, out, err = run("inspect", record, "--model", V4, "--allow-empty-layers", "-q")
    assert code == 0 and "are all zero" in out, err


def test_an_empty_score_routed_layer_is_named_without_the_hash_counts_line(tmp_path):
    counts = _v3_counts(tmp_path / "c.npz", [r for r in range(3, 61) if r != 10])
    code, _, err = run("fit", counts, *FIT, "--model", V3, "-o", tmp_path / "l.json", "-q")
    assert_one_line_error(code, err, "MoE layers [10] (per --model) are all zero", "fit")
    assert "hash-counts" not in err


@pytest.mark.parametrize("model", [(), ("--model", V3)], ids=["alone", "with --model"])
def test_the_shipped_v3_counts_keep_fitting_their_dense_layers_empty(tmp_path, model):
    code, _, err = run("inspect", P1024, *model, "-q")
    assert code == 0, err
    code, out, err = run("fit", P1024, *FIT, *model, "-o", tmp_path / "l.json", "-q")
    assert code == 0 and "all zero" not in out, err


# --- the routing groups a known shape names -------------------------------------------------------


def _fit(tmp_path: Path, name: str, *extra) -> tuple[dict, str]:
    code, out, err = run("fit", P4096, *FIT, "-o", tmp_path / f"{name}.json", "--json", "-q", *extra)
    assert code == 0, err
    return json.loads(out), err


def _worst_out_of_scene(layout: Path) -> float:
    code, out, err = run("score", layout, P1024, "--json", "-q")
    assert code == 0, err
    return json.loads(out)["summary"]["new_train"]["worst"]


def test_v3_counts_without_groups_take_deepseek_v3s_8_and_say_so(tmp_path):
    fit, err = _fit(tmp_path, "default")
    assert fit["expert_groups"] == 8 and fit["expert_groups_from"] == "DeepSeek-V3/R1's shape, 61 layers x 256 experts"
    assert "taking its 8 routing groups" in err and "--expert-groups N (1: none)" in err  # said even with -q
    none, err = _fit(tmp_path, "none", "--expert-groups", "1")
    assert none["expert_groups"] == 1 and err == ""
    grouped, plain = _worst_out_of_scene(tmp_path / "default.json"), _worst_out_of_scene(tmp_path / "none.json")
    assert grouped < plain  # the default holds up better out of scene, as its groups' hedge is meant to


def test_a_prediction_alone_is_not_a_record_but_a_record_it_filled_is(tmp_path, tiny_v4):
    spec = TinyDeepseekV4Spec()
    (tmp_path / "ids.json").write_text(json.dumps([[1, 2, 3, 4]]))
    prediction, filled = tmp_path / "hash.npz", tmp_path / "filled.npz"
    assert run("hash-counts", "--model", tiny_v4, "--token-ids", tmp_path / "ids.json", "-o", prediction, "-q")[0] == 0
    code, out, err = run("inspect", prediction, "--model", tiny_v4, "-q")
    assert code == 0 and "all zero" not in out, err
    record = read_counts(_record(tmp_path / "record.npz", spec))
    record.data[:, spec.moe_layers[-1]] = 0  # a score-routed layer the recorder missed too
    write_counts(record, tmp_path / "record.npz")
    assert (
        run(
            "hash-counts",
            "--model",
            tiny_v4,
            "--token-ids",
            tmp_path / "ids.json",
            "--fill",
            tmp_path / "record.npz",
            "--accept-token-ratio",  # four tokens cannot explain the record: not what this test is about
            "-o",
            filled,
            "-q",
        )[0]
        == 0
    )
    code, _, err = run("inspect", filled, "--model", tiny_v4, "-q")
    assert_one_line_error(code, err, f"MoE layers [{spec.moe_layers[-1]}] (per --model) are all zero", "filled")
