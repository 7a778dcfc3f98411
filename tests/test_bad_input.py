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
from pathlib import Path

import numpy as np
import pytest

from vllm_scene_eplb import cli
from vllm_scene_eplb.counts import Counts
from vllm_scene_eplb.fileio import doc_checksum
from vllm_scene_eplb.formats import write_counts

from .conftest import skewed_counts, small_tmpfs

SENTINEL = b"an output file that must survive every failure\n"
E, L = 8, 3
FIT = ("--ep-size", "2", "--redundant", "2")


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
    import torch

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


def bad_inputs(files) -> list[tuple[str, list, str]]:
    """(name, command line, text the error line must hold)."""
    import torch

    d, counts, layout = files["dir"], files["counts"], files["layout"]
    deep = 100_000
    bench = {"format": "scene-eplb-bench", "manifest": 1, "runs": [], "aggregate": {}}
    bench = _json(d, "bench.json", {**bench, "checksum": doc_checksum(bench)})
    zero = _json(d, "zero.json", {"logical_count": np.zeros((2, L, E), dtype=int).tolist()})
    big = 2**52
    cases = [
        # counts files
        ("all-zero counts fit", ["fit", zero, *FIT], "every count is zero"),
        ("all-zero counts score", ["score", layout, zero], "every count is zero"),
        (
            "integer too long to parse",
            ["inspect", _json(d, "long.json", '{"logical_count": [[1' + "9" * 5000 + "]]}")],
            "not valid JSON",
        ),
        (
            "JSON nested too deep",
            ["inspect", _json(d, "deep.json", '{"logical_count": ' + "[" * deep + "]" * deep + "}")],
            "nested deeper",
        ),
        ("npz header claims terabytes", ["inspect", _npz_claiming(d, (10**6, 10**6, 256))], "more than the"),
        ("bfloat16 counts in .pt", ["inspect", _pt(d, "bf16.pt", torch.ones((L, E), dtype=torch.bfloat16))], "bfloat16"),
        ("sparse counts in .pt", ["inspect", _pt(d, "sparse.pt", torch.eye(E, dtype=torch.int64).to_sparse())], "sparse"),
        ("booleans among counts", ["inspect", _json(d, "bool.json", '{"logical_count": [[1, true, 2]]}')], "true/false"),
        ("a string among counts", ["inspect", _json(d, "str.json", '{"logical_count": [[1, "2", 3]]}')], "str values"),
        ("null among counts", ["inspect", _json(d, "null.json", '{"logical_count": [[1, null, 3]]}')], "NoneType values"),
        (
            "counts wider than int64",
            ["inspect", _json(d, "wide.json", '{"logical_count": [[1, 2, 99999999999999999999999]]}')],
            "out of range",
        ),
        ("counts whose sum overflows", ["inspect", _json(d, "sum.json", {"logical_count": [[big] * 64] * 8})], "sums to"),
        ("ragged counts", ["inspect", _json(d, "ragged.json", '{"logical_count": [[1, 2], [3]]}')], "rectangular"),
        # layouts
        (
            "moe_layers holds a boolean",
            ["validate", _layout_with(files, "boolmoe.json", lambda x: x.update(moe_layers=[True, 1, 2]))],
            "moe_layers",
        ),
        (
            "meta is not an object",
            ["validate", _layout_with(files, "meta.json", lambda x: x.update(meta=[1, 2]))],
            "meta must be a JSON object",
        ),
        (
            "meta expectation is not an object",
            ["validate", _layout_with(files, "exp.json", lambda x: x["meta"].update(expected_balancedness=3))],
            "expected_balancedness",
        ),
        (
            "geometry with a boolean",
            ["validate", _layout_with(files, "geo.json", lambda x: x["geometry"].update(num_nodes=True))],
            "nodes",
        ),
        (
            "geometry beyond any cluster",
            ["validate", _layout_with(files, "geobig.json", lambda x: x["geometry"].update(ep_size=10**12))],
            "ep_size",
        ),
        (
            "SGLang id written as 1e20",
            ["validate", _json(d, "sg.json", {"physical_to_logical_map": [[0, 1, 2, 3, 4, 5, 6, 1e20, 0, 1]]}), "--ep-size", 2],
            "above 2147483647",
        ),
        (
            "boolean in a map",
            ["validate", _json(d, "sgb.json", {"physical_to_logical_map": [[0, 1, 2, 3, 4, 5, 6, True, 0, 1]]}), "--ep-size", 2],
            "true/false",
        ),
        (
            "report on a layout for other counts",
            ["report", layout, _json(d, "e4.json", {"logical_count": [[1, 2, 3, 4]] * L}), "-o", d / "rep-bad"],
            "e4.json: layout is for 8 experts",
        ),
        # model configs
        (
            "quantization_config a string",
            ["inspect", counts, "--model", _model_with(files, "q", quantization_config="fp8")],
            "quantization_config must be a JSON object",
        ),
        (
            "zero block size",
            [
                "inspect",
                counts,
                "--model",
                _model_with(files, "b", quantization_config={"quant_method": "fp8", "weight_block_size": [0, 128]}),
            ],
            "weight_block_size",
        ),
        (
            "zero attention heads",
            ["inspect", counts, "--model", _model_with(files, "h", num_attention_heads=0)],
            "num_attention_heads",
        ),
        (
            "non-numeric moe_layer_freq",
            ["validate", layout, "--model", _model_with(files, "f", first_k_dense_replace=0, moe_layer_freq="x")],
            "moe_layer_freq",
        ),
        ("text_config a string", ["validate", layout, "--model", _model_with(files, "t", text_config="x")], "text_config"),
        (
            "scalar mlp_only_layers",
            ["validate", layout, "--model", _model_with(files, "m", mlp_only_layers=3)],
            "mlp_only_layers",
        ),
        ("zero layers", ["validate", layout, "--model", _model_with(files, "z", num_hidden_layers=0)], "num_hidden_layers"),
        (
            "no MoE layer at all",
            ["inspect", counts, "--model", _model_with(files, "d", mlp_only_layers=[0, 1, 2])],
            "no MoE layer",
        ),
        ("boolean expert count", ["inspect", counts, "--model", _model_with(files, "e", num_experts=True)], "num_experts"),
        # options
        ("negative --expert-bytes", ["inspect", counts, "--model", files["model"], "--expert-bytes", "-5"], "--expert-bytes"),
        ("--expert-bytes without --model", ["inspect", counts, "--expert-bytes", "100"], "give --model"),
        ("reversed --moe-layers", ["convert", layout, "--to", "vllm-ascend", "--moe-layers", "5-2"], "runs backwards"),
        ("--moe-layers beyond the map", ["convert", layout, "--to", "vllm-ascend", "--moe-layers", "0-9"], "--moe-layers"),
        ("--moe-layers on counts", ["convert", counts, "--to", "sglang", "--moe-layers", "0-1"], "applies to layouts"),
        ("--ep-size 0", ["fit", counts, "--ep-size", "0", "--redundant", "0"], "argument --ep-size"),
        ("--redundant -1", ["fit", counts, "--ep-size", "2", "--redundant", "-1"], "argument --redundant"),
        ("--nodes not a number", ["fit", counts, *FIT, "--nodes", "two"], "argument --nodes"),
        ("--expert-groups 0", ["fit", counts, *FIT, "--expert-groups", "0"], "argument --expert-groups"),
        ("--scene-weights with NaN", ["fit", counts, counts, *FIT, "--scene-weights", "nan,1"], "--scene-weights"),
        ("--scene-weights with inf", ["fit", counts, counts, *FIT, "--scene-weights", "inf,1"], "--scene-weights"),
        ("--scene-weights zero", ["fit", counts, counts, *FIT, "--scene-weights", "0,1"], "--scene-weights"),
        ("--scene-weights miscounted", ["fit", counts, counts, *FIT, "--scene-weights", "1"], "1 scene weight(s) given for 2"),
        ("--num-experts 0", ["validate", layout, "--num-experts", "0"], "argument --num-experts"),
        ("watch --interval nan", ["watch", "--interval", "nan", "--once"], "argument --interval"),
        ("record --timeout -1", ["record", "status", "--timeout", "-1"], "argument --timeout"),
        (
            "bench --prefix-share 1.5",
            [
                "bench",
                "--model",
                "m",
                "--scene",
                "s",
                "-n",
                "1",
                "-c",
                "1",
                "--input-len",
                "1",
                "--output-len",
                "1",
                "--prefix-share",
                "1.5",
            ],
            "argument --prefix-share",
        ),
        (
            "bench -n 0",
            ["bench", "--model", "m", "--scene", "s", "-n", "0", "-c", "1", "--input-len", "1", "--output-len", "1"],
            "argument -n",
        ),
        ("unknown option", ["inspect", counts, "--frobnicate"], "unrecognized arguments"),
        # servers, logs and bench results
        ("a URL without a scheme", ["record", "status", "--url", "localhost:8000"], "expected a server base URL"),
        ("a malformed URL", ["record", "status", "--url", "http://[::1"], "cannot reach the server"),
        ("a missing server log", ["audit", "--log", d / "no.log"], "cannot read server log"),
        ("a bench result of the wrong shape", ["compare", bench, bench], "bench result has no 'manifest' dict"),
        ("a bench result that is a counts file", ["compare", counts, counts], "cannot read bench result"),
    ]
    return cases


def test_every_bad_input_gets_one_line_and_leaves_the_output_untouched(files):
    out = files["dir"] / "existing-output.json"
    failures = []
    for name, args, expected in bad_inputs(files):
        out.write_bytes(SENTINEL)
        cmd = list(args)
        if cmd[0] in ("fit", "convert"):
            cmd += ["-o", out]
        if cmd[0] == "bench":
            cmd += ["-o", out]
        code, stdout, err = run(*cmd, "-q")
        try:
            assert_one_line_error(code, err, expected, name)
            assert out.read_bytes() == SENTINEL, name
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)


def output_cases(files) -> list[tuple[str, Path | str, str]]:
    """(name, -o value, text the error line must hold) for paths no command can write."""
    d = files["dir"]
    (d / "a-file").write_text("x")
    (d / "a-dir").mkdir(exist_ok=True)
    return [
        ("a directory", d / "a-dir", "is a directory"),
        ("under a regular file", d / "a-file" / "l.json", "is not a directory"),
        ("an empty string", "", "output path is empty"),
        ("a missing folder", d / "no-such-folder" / "l.json", "does not exist"),
        ("an input file", files["counts"], "would replace an input"),
    ]


def test_output_paths_are_checked_before_any_work(files):
    for name, out, expected in output_cases(files):
        for cmd in (["fit", files["counts"], *FIT], ["convert", files["counts"], "--to", "native"]):
            code, _, err = run(*cmd, "-o", out, "-q")
            assert_one_line_error(code, err, expected, f"{cmd[0]}: {name}")
    assert files["counts"].stat().st_size > 0
    code, _, err = run("report", files["layout"], files["counts"], "-o", files["dir"] / "a-file", "-q")
    assert_one_line_error(code, err, "not a directory", "report into a file")


@pytest.fixture()
def small_disk(tmp_path):
    """A 64 KiB disk that fills up."""
    with small_tmpfs(tmp_path / "small", "64k") as mnt:
        yield mnt


def test_a_full_disk_or_read_only_place_is_one_line_and_the_old_file_survives(files, small_disk):
    big = write_counts(
        Counts(np.random.default_rng(0).integers(0, 10**6, (512, L, E)), {}), files["dir"] / "big.npz"
    )  # ~100 KB as JSON
    out = small_disk / "counts.json"
    out.write_bytes(SENTINEL)
    (small_disk / "filler").write_bytes(bytes(16 * 1024))
    code, _, err = run("convert", big, "--to", "sglang", "-o", out, "-q")
    assert_one_line_error(code, err, "No space left on device", "full disk")
    assert out.read_bytes() == SENTINEL
    assert sorted(p.name for p in small_disk.iterdir()) == ["counts.json", "filler"]  # no temporary file left
    (small_disk / "filler2").write_bytes(bytes(40 * 1024))  # room for some of a report's files, not all
    code, _, err = run("report", files["layout"], files["counts"], "-o", small_disk / "report", "-q")
    assert_one_line_error(code, err, "No space left on device", "report on a full disk")
    assert not list((small_disk / "report").iterdir())  # all or nothing
    (small_disk / "filler2").unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    code, _, err = run("fit", files["counts"], *FIT, "-o", out, "-q")
    assert_one_line_error(code, err, "not writable", "read-only file system")
    assert out.read_bytes() == SENTINEL


def test_unusual_but_valid_inputs_are_accepted_with_correct_results(files):
    d = files["dir"]
    # weights at the edge of float range are normalised, not turned into zeros
    code, out, err = run(
        "fit", files["counts"], files["counts"], *FIT, "--scene-weights", "1e308,1e308", "-o", d / "w.json", "--json", "-q"
    )
    assert code == 0, err
    assert [s["weight"] for s in json.loads(out)["scenes"]] == [0.5, 0.5]
    # counts at the accepted edge: totals exact, every layer routed
    edge = 2**53 // (2 * L * E)
    code, out, err = run("inspect", _json(d, "edge.json", {"logical_count": [[[edge] * E] * L] * 2}), "--json", "-q")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["active_layers"] == list(range(L)) and doc["assignments_per_layer"]["max"] == 2 * E * edge
    # integral floats, a 2-D [L, E] file and a single layer range for convert are fine
    code, out, err = run(
        "inspect", _json(d, "floats.json", {"logical_count": [[1.0, 2.0] + [0.0] * (E - 2)] * L}), "--json", "-q"
    )
    assert code == 0 and json.loads(out)["shape"] == [1, L, E], err
    code, _, err = run("convert", files["layout"], "--to", "vllm-ascend", "--moe-layers", "0-2", "-o", d / "ascend.json", "-q")
    assert code == 0, err


def test_an_unexpected_exception_is_one_line_that_says_bug_and_debug_shows_the_traceback(files, monkeypatch):
    from vllm_scene_eplb.commands import inspect

    def broken(args, console):
        raise RuntimeError("something nobody planned for")

    monkeypatch.setattr(inspect, "run", broken)
    code, _, err = run("inspect", files["counts"])
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1 and "internal error (a bug" in lines[0] and "--debug" in lines[0]
    assert "RuntimeError: something nobody planned for" in lines[0]
    code, _, err = run("inspect", files["counts"], "--debug")
    assert code == 3 and "Traceback" in err


class _Payload:
    """Unpickling this would run a command: a .pt file carrying it must be refused without running it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_what_held_keeps_holding_code_never_runs_symlinks_are_replaced_concurrent_writes_leave_one_file(files, tmp_path):
    import torch

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"logical_count": _Payload(marker)}, evil)
    code, _, err = run("inspect", evil, "-q")
    assert_one_line_error(code, err, "not a readable torch file", "pickle payload")
    assert not marker.exists()
    objects = tmp_path / "objects.npz"
    np.savez(objects, logical_count=np.array([[1, None]], dtype=object), meta=np.frombuffer(b"{}", dtype=np.uint8))
    code, _, err = run("inspect", objects, "-q")
    assert_one_line_error(code, err, "array of integers", "object array in .npz")
    # an output symlink is replaced by the new file, never written through
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_bytes(SENTINEL)
    link.symlink_to(target)
    code, _, err = run("fit", files["counts"], *FIT, "-o", link, "-q")
    assert code == 0, err
    assert target.read_bytes() == SENTINEL and not link.is_symlink()
    # concurrent fits to one path leave one whole, valid file and no temporary ones
    out = tmp_path / "shared.json"
    procs = [
        subprocess.Popen([sys.executable, "-m", "vllm_scene_eplb.cli", "fit", str(files["counts"]), *FIT, "-o", str(out), "-q"])
        for _ in range(4)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    assert run("validate", out, "-q")[0] == 0
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
