"""A hostile user's corpus, generated here: every malformed input, option and output path across the
CLI ends in one line ``scene-eplb: error: ...`` (exit 2) with no traceback, and an output file that
existed before survives byte for byte. Unusual-but-valid inputs are accepted with a correct result.

The commands run in this process (``cli.main``) for speed; ``test_cli.py`` runs them as subprocesses.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_scene_eplb import cli
from vllm_scene_eplb.fileio import doc_checksum
from vllm_scene_eplb.formats import write_counts
from vllm_scene_eplb.layouts.counts import Counts

from ..conftest import skewed_counts, small_tmpfs

SENTINEL = b"an output file that must survive every failure\n"
E, L = 8, 3
FIT = ("--ep-size", "2", "--redundant", "2")
BENCH = ("bench", "--served-model-name", "m", "--scene", "s", "-c", "1", "--input-len", "1", "--output-len", "1")


def run(*args) -> tuple[int, str, str]:
    """``scene-eplb ARGS`` in this process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as exc:  # argparse's errors and --help
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code: int, err: str, expected: str, name: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, (name, code, err)
    assert "Traceback" not in err, (name, err)
    assert len(lines) == 1 and lines[0].startswith("scene-eplb: error: "), (name, lines)
    assert expected in lines[0], (name, lines[0])


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A good counts file, a good fitted layout and a model config, to mutate."""
    d = tmp_path_factory.mktemp("corpus")
    good = write_counts(
        Counts(skewed_counts(4, L, E), {"model": "m", "role": "prefill", "moe_layers": [0, 1, 2]}), d / "good.npz"
    )
    code, _, err = run("fit", good, *FIT, "-o", d / "layout.json", "-q")
    assert code == 0, err
    (d / "model").mkdir()
    (d / "model" / "config.json").write_text(json.dumps(MODEL))
    return {"dir": d, "counts": good, "layout": d / "layout.json", "model": d / "model"}


MODEL = {
    "num_hidden_layers": L,
    "num_experts": E,
    "num_experts_per_tok": 2,
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "torch_dtype": "bfloat16",
}


def _json(d: Path, name: str, doc) -> Path:
    p = d / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def _npz_claiming(d: Path, shape: tuple[int, ...]) -> Path:
    """A native-looking archive whose counts header claims ``shape`` over a few bytes of data."""
    p = d / "huge.npz"
    header = io.BytesIO()
    np.lib.format.write_array_header_2_0(header, {"descr": "<i8", "fortran_order": False, "shape": shape})
    meta = io.BytesIO()
    np.save(meta, np.frombuffer(b"{}", dtype=np.uint8))
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("logical_count.npy", header.getvalue() + b"\0" * 64)
        zf.writestr("meta.npy", meta.getvalue())
    return p


def _pt(d: Path, name: str, tensor) -> Path:
    p = d / name
    torch.save({"logical_count": tensor}, p)
    return p


def _layout_with(files, name: str, mutate) -> Path:
    """The good layout with ``mutate`` applied and its checksum recomputed (a deliberate, consistent edit)."""
    doc = json.loads(files["layout"].read_text())
    mutate(doc)
    doc["checksum"] = doc_checksum(doc)
    return _json(files["dir"], name, doc)


def _model_with(files, name: str, **changes) -> Path:
    d = files["dir"] / f"model-{name}"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**MODEL, **changes}))
    return d


@dataclass(frozen=True)
class Corpus:
    """The files a hostile case may point at or mutate (from the ``files`` fixture)."""

    files: dict
    bench: Path
    zero: Path

    @property
    def d(self) -> Path:
        return self.files["dir"]

    @property
    def counts(self) -> Path:
        return self.files["counts"]

    @property
    def layout(self) -> Path:
        return self.files["layout"]


DEEP = 100_000
BIG = 2**52

# (name: the test id, the command line built from the corpus, text the error line must hold)
BAD_INPUTS: list[tuple[str, Callable[[Corpus], list], str]] = [
    ("all-zero counts fit", lambda c: ["fit", c.zero, *FIT], "every count is zero"),
    ("all-zero counts score", lambda c: ["score", c.layout, c.zero], "every count is zero"),
    (
        "integer too long to parse",
        lambda c: ["inspect", _json(c.d, "long.json", '{"logical_count": [[1' + "9" * 5000 + "]]}")],
        "not valid JSON",
    ),
    (
        "JSON nested too deep",
        lambda c: ["inspect", _json(c.d, "deep.json", '{"logical_count": ' + "[" * DEEP + "]" * DEEP + "}")],
        "nested deeper",
    ),
    ("npz header claims terabytes", lambda c: ["inspect", _npz_claiming(c.d, (10**6, 10**6, 256))], "more than the"),
    ("bfloat16 counts in .pt", lambda c: ["inspect", _pt(c.d, "bf16.pt", torch.ones((L, E), dtype=torch.bfloat16))], "bfloat16"),
    ("sparse counts in .pt", lambda c: ["inspect", _pt(c.d, "sparse.pt", torch.eye(E, dtype=torch.int64).to_sparse())], "sparse"),
    ("booleans among counts", lambda c: ["inspect", _json(c.d, "bool.json", '{"logical_count": [[1, true, 2]]}')], "true/false"),
    ("a string among counts", lambda c: ["inspect", _json(c.d, "str.json", '{"logical_count": [[1, "2", 3]]}')], "str values"),
    ("null among counts", lambda c: ["inspect", _json(c.d, "null.json", '{"logical_count": [[1, null, 3]]}')], "NoneType values"),
    (
        "counts wider than int64",
        lambda c: ["inspect", _json(c.d, "wide.json", '{"logical_count": [[1, 2, 99999999999999999999999]]}')],
        "out of range",
    ),
    ("counts whose sum overflows", lambda c: ["inspect", _json(c.d, "sum.json", {"logical_count": [[BIG] * 64] * 8})], "sums to"),
    ("ragged counts", lambda c: ["inspect", _json(c.d, "ragged.json", '{"logical_count": [[1, 2], [3]]}')], "rectangular"),
    (
        "moe_layers holds a boolean",
        lambda c: ["validate", _layout_with(c.files, "boolmoe.json", lambda x: x.update(moe_layers=[True, 1, 2]))],
        "moe_layers",
    ),
    (
        "meta is not an object",
        lambda c: ["validate", _layout_with(c.files, "meta.json", lambda x: x.update(meta=[1, 2]))],
        "meta must be a JSON object",
    ),
    (
        "meta expectation is not an object",
        lambda c: ["validate", _layout_with(c.files, "exp.json", lambda x: x["meta"].update(expected_balancedness=3))],
        "expected_balancedness",
    ),
    (
        "geometry with a boolean",
        lambda c: ["validate", _layout_with(c.files, "geo.json", lambda x: x["geometry"].update(num_nodes=True))],
        "nodes",
    ),
    (
        "geometry beyond any cluster",
        lambda c: ["validate", _layout_with(c.files, "geobig.json", lambda x: x["geometry"].update(ep_size=10**12))],
        "ep_size",
    ),
    (
        "SGLang id written as 1e20",
        lambda c: [
            "validate",
            _json(c.d, "sg.json", {"physical_to_logical_map": [[0, 1, 2, 3, 4, 5, 6, 1e20, 0, 1]]}),
            "--ep-size",
            2,
        ],
        "above 2147483647",
    ),
    (
        "boolean in a map",
        lambda c: [
            "validate",
            _json(c.d, "sgb.json", {"physical_to_logical_map": [[0, 1, 2, 3, 4, 5, 6, True, 0, 1]]}),
            "--ep-size",
            2,
        ],
        "true/false",
    ),
    (
        "report on a layout for other counts",
        lambda c: ["report", c.layout, _json(c.d, "e4.json", {"logical_count": [[1, 2, 3, 4]] * L}), "-o", c.d / "rep-bad"],
        "e4.json: layout is for 8 experts",
    ),
    (
        "quantization_config a string",
        lambda c: ["inspect", c.counts, "--model", _model_with(c.files, "q", quantization_config="fp8")],
        "quantization_config must be a JSON object",
    ),
    (
        "zero block size",
        lambda c: [
            "inspect",
            c.counts,
            "--model",
            _model_with(c.files, "b", quantization_config={"quant_method": "fp8", "weight_block_size": [0, 128]}),
        ],
        "weight_block_size",
    ),
    (
        "zero attention heads",
        lambda c: ["inspect", c.counts, "--model", _model_with(c.files, "h", num_attention_heads=0)],
        "num_attention_heads",
    ),
    (
        "non-numeric moe_layer_freq",
        lambda c: ["validate", c.layout, "--model", _model_with(c.files, "f", first_k_dense_replace=0, moe_layer_freq="x")],
        "moe_layer_freq",
    ),
    (
        "text_config a string",
        lambda c: ["validate", c.layout, "--model", _model_with(c.files, "t", text_config="x")],
        "text_config",
    ),
    (
        "scalar mlp_only_layers",
        lambda c: ["validate", c.layout, "--model", _model_with(c.files, "m", mlp_only_layers=3)],
        "mlp_only_layers",
    ),
    (
        "zero layers",
        lambda c: ["validate", c.layout, "--model", _model_with(c.files, "z", num_hidden_layers=0)],
        "num_hidden_layers",
    ),
    (
        "no MoE layer at all",
        lambda c: ["inspect", c.counts, "--model", _model_with(c.files, "d", mlp_only_layers=[0, 1, 2])],
        "no MoE layer",
    ),
    (
        "boolean expert count",
        lambda c: ["inspect", c.counts, "--model", _model_with(c.files, "e", num_experts=True)],
        "num_experts",
    ),
    (
        "negative --expert-bytes",
        lambda c: ["inspect", c.counts, "--model", c.files["model"], "--expert-bytes", "-5"],
        "--expert-bytes",
    ),
    ("--expert-bytes without --model", lambda c: ["inspect", c.counts, "--expert-bytes", "100"], "give --model"),
    ("reversed --moe-layers", lambda c: ["convert", c.layout, "--to", "vllm-ascend", "--moe-layers", "5-2"], "runs backwards"),
    (
        "--moe-layers beyond the map",
        lambda c: ["convert", c.layout, "--to", "vllm-ascend", "--moe-layers", "0-9"],
        "--moe-layers",
    ),
    ("--moe-layers on counts", lambda c: ["convert", c.counts, "--to", "sglang", "--moe-layers", "0-1"], "applies to layouts"),
    ("--ep-size 0", lambda c: ["fit", c.counts, "--ep-size", "0", "--redundant", "0"], "argument --ep-size"),
    ("--redundant -1", lambda c: ["fit", c.counts, "--ep-size", "2", "--redundant", "-1"], "argument --redundant"),
    ("--nodes not a number", lambda c: ["fit", c.counts, *FIT, "--nodes", "two"], "argument --nodes"),
    ("--expert-groups 0", lambda c: ["fit", c.counts, *FIT, "--expert-groups", "0"], "argument --expert-groups"),
    ("--scene-weights with NaN", lambda c: ["fit", c.counts, c.counts, *FIT, "--scene-weights", "nan,1"], "--scene-weights"),
    ("--scene-weights with inf", lambda c: ["fit", c.counts, c.counts, *FIT, "--scene-weights", "inf,1"], "--scene-weights"),
    ("--scene-weights zero", lambda c: ["fit", c.counts, c.counts, *FIT, "--scene-weights", "0,1"], "--scene-weights"),
    (
        "--scene-weights miscounted",
        lambda c: ["fit", c.counts, c.counts, *FIT, "--scene-weights", "1"],
        "1 scene weight(s) given for 2",
    ),
    ("--num-experts 0", lambda c: ["validate", c.layout, "--num-experts", "0"], "argument --num-experts"),
    ("watch --interval nan", lambda c: ["watch", "--interval", "nan", "--once"], "argument --interval"),
    ("record --timeout -1", lambda c: ["record", "status", "--timeout", "-1"], "argument --timeout"),
    ("bench --prefix-share 1.5", lambda c: [*BENCH, "-n", "1", "--prefix-share", "1.5"], "argument --prefix-share"),
    ("bench -n 0", lambda c: [*BENCH, "-n", "0"], "argument -n"),
    ("unknown option", lambda c: ["inspect", c.counts, "--frobnicate"], "unrecognized arguments"),
    ("a URL without a scheme", lambda c: ["record", "status", "--url", "localhost:8000"], "expected a server base URL"),
    ("a malformed URL", lambda c: ["record", "status", "--url", "http://[::1"], "cannot reach the server"),
    ("a missing server log", lambda c: ["audit", "--log", c.d / "no.log"], "cannot read server log"),
    ("a bench result of the wrong shape", lambda c: ["compare", c.bench, c.bench], "bench result has no 'manifest' dict"),
    ("a bench result that is a counts file", lambda c: ["compare", c.counts, c.counts], "cannot read bench result"),
]


@pytest.fixture(scope="module")
def corpus(files) -> Corpus:
    d = files["dir"]
    bench = {"format": "scene-eplb-bench", "manifest": 1, "runs": [], "aggregate": {}}
    bench_file = _json(d, "bench.json", {**bench, "checksum": doc_checksum(bench)})
    zero = _json(d, "zero.json", {"logical_count": np.zeros((2, L, E), dtype=int).tolist()})
    return Corpus(files, bench_file, zero)


@pytest.mark.parametrize(("name", "build", "expected"), BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_gets_one_line_and_leaves_the_output_untouched(corpus, name, build, expected):
    out = corpus.d / "existing-output.json"
    out.write_bytes(SENTINEL)
    cmd = list(build(corpus))
    if cmd[0] in ("fit", "convert", "bench"):
        cmd += ["-o", out]
    code, _, err = run(*cmd, "-q")
    assert_one_line_error(code, err, expected, name)
    assert out.read_bytes() == SENTINEL, name


# (name: the test id, the -o value built from the corpus, text the error line must hold): paths no command can write
OUTPUT_CASES: list[tuple[str, Callable[[Corpus], Path | str], str]] = [
    ("a directory", lambda c: c.d / "a-dir", "is a directory"),
    ("under a regular file", lambda c: c.d / "a-file" / "l.json", "is not a directory"),
    ("an empty string", lambda c: "", "output path is empty"),
    ("a missing folder", lambda c: c.d / "no-such-folder" / "l.json", "does not exist"),
    ("an input file", lambda c: c.counts, "would replace an input"),
]


@pytest.mark.parametrize("command", ["fit", "convert"])
@pytest.mark.parametrize(("name", "build", "expected"), OUTPUT_CASES, ids=[case[0] for case in OUTPUT_CASES])
def test_an_output_path_no_command_can_write_is_refused_before_any_work(corpus, command, name, build, expected):
    (corpus.d / "a-file").write_text("x")
    (corpus.d / "a-dir").mkdir(exist_ok=True)
    cmd = ["fit", corpus.counts, *FIT] if command == "fit" else ["convert", corpus.counts, "--to", "scene-eplb"]
    code, _, err = run(*cmd, "-o", build(corpus), "-q")
    assert_one_line_error(code, err, expected, f"{command}: {name}")
    assert corpus.counts.stat().st_size > 0


def test_a_report_into_a_regular_file_is_refused(files):
    (files["dir"] / "a-file").write_text("x")
    code, _, err = run("report", files["layout"], files["counts"], "-o", files["dir"] / "a-file", "-q")
    assert_one_line_error(code, err, "not a directory", "report into a file")


@pytest.fixture()
def small_disk(tmp_path):
    """A 64 KiB disk that fills up."""
    with small_tmpfs(tmp_path / "small", "64k") as mnt:
        yield mnt


def _old_output(small_disk: Path) -> Path:
    """The small disk with an existing output and 16 KiB of filler: what each case must leave as it was."""
    out = small_disk / "counts.json"
    out.write_bytes(SENTINEL)
    (small_disk / "filler").write_bytes(bytes(16 * 1024))
    return out


def test_a_full_disk_is_one_line_and_the_old_file_survives(files, small_disk):
    big = write_counts(
        Counts(np.random.default_rng(0).integers(0, 10**6, (512, L, E)), {}), files["dir"] / "big.npz"
    )  # ~100 KB as JSON
    out = _old_output(small_disk)
    code, _, err = run("convert", big, "--to", "sglang", "-o", out, "-q")
    assert_one_line_error(code, err, "No space left on device", "full disk")
    assert out.read_bytes() == SENTINEL
    assert sorted(p.name for p in small_disk.iterdir()) == ["counts.json", "filler"]  # no temporary file left


def test_a_report_on_a_full_disk_writes_all_of_its_files_or_none(files, small_disk):
    _old_output(small_disk)
    (small_disk / "filler2").write_bytes(bytes(40 * 1024))  # room for some of a report's files, not all
    code, _, err = run("report", files["layout"], files["counts"], "-o", small_disk / "report", "-q")
    assert_one_line_error(code, err, "No space left on device", "report on a full disk")
    assert not list((small_disk / "report").iterdir())  # all or nothing


def test_a_read_only_place_is_one_line_and_the_old_file_survives(files, small_disk):
    out = _old_output(small_disk)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    code, _, err = run("fit", files["counts"], *FIT, "-o", out, "-q")
    assert_one_line_error(code, err, "not writable", "read-only file system")
    assert out.read_bytes() == SENTINEL


def test_scene_weights_at_the_edge_of_float_range_are_normalised_not_turned_into_zeros(files):
    d = files["dir"]
    code, out, err = run(
        "fit", files["counts"], files["counts"], *FIT, "--scene-weights", "1e308,1e308", "-o", d / "w.json", "--json", "-q"
    )
    assert code == 0, err
    assert [s["weight"] for s in json.loads(out)["scenes"]] == [0.5, 0.5]


def test_counts_at_the_accepted_edge_keep_exact_totals_and_every_layer(files):
    d = files["dir"]
    edge = 2**53 // (2 * L * E)
    code, out, err = run("inspect", _json(d, "edge.json", {"logical_count": [[[edge] * E] * L] * 2}), "--json", "-q")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["active_layers"] == list(range(L)) and doc["assignments_per_layer"]["max"] == 2 * E * edge


def test_integral_float_counts_in_a_2d_file_are_read_as_one_pass(files):
    d = files["dir"]
    code, out, err = run(
        "inspect", _json(d, "floats.json", {"logical_count": [[1.0, 2.0] + [0.0] * (E - 2)] * L}), "--json", "-q"
    )
    assert code == 0 and json.loads(out)["shape"] == [1, L, E], err


def test_convert_takes_a_range_of_moe_layers(files):
    d = files["dir"]
    code, _, err = run("convert", files["layout"], "--to", "vllm-ascend", "--moe-layers", "0-2", "-o", d / "ascend.json", "-q")
    assert code == 0, err


@pytest.fixture()
def broken_inspect(monkeypatch):
    """``scene-eplb inspect`` with a bug: it raises what no check planned for."""
    from vllm_scene_eplb.commands import inspect

    def broken(args, console):
        raise RuntimeError("something nobody planned for")

    monkeypatch.setattr(inspect, "run", broken)


def test_an_unexpected_exception_is_one_line_that_says_bug(files, broken_inspect):
    code, _, err = run("inspect", files["counts"])
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1 and "internal error (a bug" in lines[0] and "--debug" in lines[0]
    assert "RuntimeError: something nobody planned for" in lines[0]


def test_debug_shows_the_traceback_of_an_unexpected_exception(files, broken_inspect):
    code, _, err = run("inspect", files["counts"], "--debug")
    assert code == 3 and "Traceback" in err


class _Payload:
    """Unpickling this would run a command: a .pt file carrying it must be refused without running it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_payload_in_a_pt_file_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"logical_count": _Payload(marker)}, evil)
    code, _, err = run("inspect", evil, "-q")
    assert_one_line_error(code, err, "not a readable torch file", "pickle payload")
    assert not marker.exists()


def test_an_object_array_in_an_npz_is_refused(tmp_path):
    objects = tmp_path / "objects.npz"
    np.savez(objects, logical_count=np.array([[1, None]], dtype=object), meta=np.frombuffer(b"{}", dtype=np.uint8))
    code, _, err = run("inspect", objects, "-q")
    assert_one_line_error(code, err, "array of integers", "object array in .npz")


def test_an_output_symlink_is_replaced_by_the_new_file_never_written_through(files, tmp_path):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_bytes(SENTINEL)
    link.symlink_to(target)
    code, _, err = run("fit", files["counts"], *FIT, "-o", link, "-q")
    assert code == 0, err
    assert target.read_bytes() == SENTINEL and not link.is_symlink()


def test_concurrent_fits_to_one_path_leave_one_whole_valid_file_and_no_temporary_ones(files, tmp_path):
    out = tmp_path / "shared.json"
    procs = [
        subprocess.Popen([sys.executable, "-m", "vllm_scene_eplb.cli", "fit", str(files["counts"]), *FIT, "-o", str(out), "-q"])
        for _ in range(4)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    assert run("validate", out, "-q")[0] == 0
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
