"""The `scene-eplb` command as a user runs it: real subprocesses, real files."""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_scene_eplb.formats import write_counts
from vllm_scene_eplb.layouts.counts import Counts

from ..conftest import skewed_counts


def run(*args, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_scene_eplb.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def counts_file(tmp_path_factory):
    data = skewed_counts(8, 4, 32, seed=5)
    data[:, 0] = 0
    return write_counts(Counts(data, {"model": "tiny", "moe_layers": [1, 2, 3]}), tmp_path_factory.mktemp("c") / "counts.npz")


def test_fit_score_validate_convert_report_end_to_end(tmp_path, counts_file, real_counts_paths):
    fit = json.loads(run("fit", counts_file, "--ep-size", 4, "--redundant", 8, "-o", tmp_path / "l.json", "--json", "-q").stdout)
    s = fit["summary"]
    assert s["layers"] == 3 and s["new_holdout"] is not None
    assert s["new_train"]["worst"] < s["old_train"]["worst"]
    v = json.loads(run("validate", tmp_path / "l.json", "--json").stdout)
    assert v["valid"] and v["layout_hash"] == s["layout_hash"] and v["moe_layers"] == [1, 2, 3]
    sc = json.loads(run("score", tmp_path / "l.json", counts_file, "--json", "-q").stdout)
    assert sc["summary"]["new_train"] == s["new_train"]
    run("convert", tmp_path / "l.json", "--to", "vllm-ascend", "-o", tmp_path / "a.json")
    assert json.loads((tmp_path / "a.json").read_text())["moe_layer_count"] == 3
    run("convert", counts_file, "--to", "sglang", "-o", tmp_path / "c.json")
    run("convert", tmp_path / "c.json", "--to", "native", "-o", tmp_path / "c2.npz")
    assert "counts [T=8, L=4, E=32]" in run("inspect", tmp_path / "c2.npz").stdout
    rep = run("report", tmp_path / "l.json", counts_file, "-o", tmp_path / "rep")
    assert (tmp_path / "rep" / "report.md").read_text().count("\n| ") >= 3 + 6
    assert (tmp_path / "rep" / "rank_load_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    assert "progress" not in rep.stdout


def test_fit_real_deepseek_counts_prints_summary(tmp_path, real_counts_paths):
    out = run("fit", real_counts_paths[1], "--ep-size", 16, "--redundant", 16, "-o", tmp_path / "l.json").stdout
    assert "new_train" in out and "NOT_OBSERVED" in out  # [L, E] files have no holdout slots
    v = run("validate", tmp_path / "l.json").stdout
    assert "61 layers (58 MoE)" in v


def test_validate_against_a_model_config(tmp_path, counts_file):
    run("fit", counts_file, "--ep-size", 4, "--redundant", 8, "-o", tmp_path / "l.json", "-q")
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_experts": 32, "mlp_only_layers": [0]}))
    assert "matches model" in run("validate", tmp_path / "l.json", "--model", tmp_path / "ok").stdout
    (tmp_path / "bad.json").write_text(json.dumps({"num_hidden_layers": 4, "num_experts": 64}))
    proc = run("validate", tmp_path / "l.json", "--model", tmp_path / "bad.json", check=False)
    assert proc.returncode == 2 and "64" in proc.stderr


ROW = list(range(32)) + list(range(8))  # a valid bare layout row: 32 experts, 8 redundant slots
FIT = ["--ep-size", 4, "--redundant", 8]


@pytest.fixture(scope="module")
def good_layout(tmp_path_factory, counts_file):
    good = tmp_path_factory.mktemp("good") / "good.json"
    run("fit", counts_file, *FIT, "-o", good, "-q")
    return good


@dataclass(frozen=True)
class Work:
    """Where a bad-input case writes its file, and the good files it starts from."""

    dir: Path
    counts: Path
    layout: Path

    def write(self, name: str, text: str) -> Path:
        p = self.dir / name
        p.write_text(text)
        return p

    def counts_json(self, name: str, value) -> Path:
        return self.write(f"{name}.json", value if isinstance(value, str) else json.dumps({"logical_count": value}))

    def bare(self, name: str, rows) -> Path:
        return self.write(f"{name}.json", json.dumps({"physical_to_logical_map": rows}))

    def tampered(self, name: str, mutate) -> Path:
        doc = json.loads(self.layout.read_text())
        mutate(doc)
        return self.write(f"{name}.json", json.dumps(doc))

    def truncated(self, name: str, source: Path, size: int) -> Path:
        p = self.dir / name
        p.write_bytes(source.read_bytes()[:size])
        return p


# (name, the command's arguments from a Work, the text its one-line error must hold)
BAD_INPUTS = [
    ("wrong shape", lambda w: ["fit", w.counts_json("shape", [[[[1]]]]), *FIT], "must be [T, L, E]"),
    ("float counts", lambda w: ["inspect", w.counts_json("float", [[1.5, 2]])], "fractional"),
    ("negative", lambda w: ["inspect", w.counts_json("neg", [[1, -2]])], "negative"),
    ("NaN", lambda w: ["inspect", w.counts_json("nan", '{"logical_count": [[1, NaN]]}')], "non-finite"),
    ("truncated counts", lambda w: ["inspect", w.counts_json("trunc", '{"logical_count": [[1, 2], [3')], "not valid JSON"),
    (
        "id out of range",
        lambda w: ["validate", w.bare("range", [ROW[:-1] + [99]]), "--ep-size", 4, "--num-experts", 32],
        "outside [0, 32)",
    ),
    (
        "missing expert",
        lambda w: ["validate", w.bare("missing", [ROW[:15] + [25] + ROW[16:]]), "--ep-size", 4, "--num-experts", 32],
        "have no slot",
    ),
    (
        "same-rank duplicate",
        lambda w: ["validate", w.bare("dup", [[0, 0] + ROW[2:32] + [1] + ROW[33:]]), "--ep-size", 4],
        "twice",
    ),
    ("geometry does not divide", lambda w: ["fit", w.counts, "--ep-size", 3, "--redundant", 8], "not divisible by ep_size 3"),
    ("bare layout geometry", lambda w: ["validate", w.bare("div", [ROW]), "--ep-size", 3], "not divisible"),
    ("truncated layout", lambda w: ["validate", w.truncated("trunc_layout.json", w.layout, 200)], "not valid JSON"),
    (
        "checksum mismatch",
        lambda w: ["validate", w.tampered("tamper", lambda d: d["meta"].update(role="decode"))],
        "checksum mismatch",
    ),
    ("truncated npz", lambda w: ["inspect", w.truncated("trunc.npz", w.counts, 300)], "truncated or corrupt"),
    ("counts given as layout", lambda w: ["validate", w.counts_json("asl", [[1, 2]])], "counts file, not a layout"),
    ("no such file", lambda w: ["inspect", w.dir / "nope.json"], "no such file"),
    (
        "advise ep-size fractional",
        lambda w: ["advise", w.counts, "--layout", w.layout, "--ep-size", "1.5"],
        "argument --ep-size: expected an integer in [1, 1048576], got '1.5'",
    ),
    (
        "advise nodes nan",
        lambda w: ["advise", w.counts, "--layout", w.layout, "--nodes", "nan"],
        "argument --nodes: expected an integer in [1, 1048576], got 'nan'",
    ),
]


@pytest.mark.parametrize(("name", "args", "text"), BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_a_bad_input_gets_one_line_no_traceback_and_no_output(tmp_path, counts_file, good_layout, name, args, text):
    out = tmp_path / "out"
    cmd = list(args(Work(tmp_path, counts_file, good_layout)))
    if cmd[0] in ("fit",):
        cmd += ["-o", out]
    proc = run(*cmd, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (name, proc.stderr)
    assert "Traceback" not in proc.stderr, name
    assert text in lines[-1], (name, lines)
    assert lines[-1].startswith("scene-eplb: error: "), (name, lines)
    assert not out.exists(), name


@pytest.mark.parametrize(
    "command",
    [
        lambda bad, d: ["convert", bad, "--to", "scene-eplb", "-o", d / "o.npz"],
        lambda bad, d: ["fit", bad, "--ep-size", 1, "--redundant", 0, "-o", d / "o.json"],
    ],
    ids=["convert", "fit"],
)
def test_convert_and_fit_write_nothing_on_bad_input(tmp_path, command):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"logical_count": [[1, -1]]}))
    proc = run(*command(bad, tmp_path), check=False)
    assert proc.returncode == 2 and "bad.json" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_help_explains_commands():
    out = run("--help").stdout
    for cmd in ("inspect", "fit", "validate", "score", "convert", "report"):
        assert cmd in out
    assert "--dispatch" in run("fit", "--help").stdout


def test_audit_from_the_log_alone_where_the_plugin_has_no_routes(tmp_path, counts_file):
    """vLLM-Ascend workers log the startup line but serve no status route: audit reads the log."""
    from vllm_scene_eplb.formats import read_layout
    from vllm_scene_eplb.protocol import startup_line

    run("fit", counts_file, "--ep-size", 4, "--redundant", 8, "-o", tmp_path / "l.json", "-q")
    layout = read_layout(tmp_path / "l.json")
    line = startup_line(
        {
            "role": "prefill",
            "observer": "off",
            "layout_hash": layout.digest(),
            "redundant_slots": 8,
            "dispatch": "static",
            "ep_size": 4,
            "load_audit": "passed:40-slots,120-writes",
        },
        "vLLM-Ascend, expert_map_path /d/expert_map.json",
    )
    (tmp_path / "p.log").write_text(f"INFO x {line}\nINFO y {line}\n")
    ok = json.loads(
        run(
            "audit",
            "--log",
            tmp_path / "p.log",
            "--layout",
            tmp_path / "l.json",
            "--dispatch",
            "static",
            "--recorder",
            "off",
            "--json",
        ).stdout
    )
    assert ok["ok"] and len(ok["checks"]) == 7
    assert {"name": "load audit", "ok": True, "detail": "passed on 1 rank(s)"} in ok["checks"]
    (tmp_path / "refused.log").write_text(
        f"INFO x {line.replace('load_audit=passed:40-slots,120-writes', 'load_audit=refused')}\n"
    )
    refused = run("audit", "--log", tmp_path / "refused.log", "--layout", tmp_path / "l.json", check=False)
    assert refused.returncode == 1 and "FAIL  load audit" in refused.stdout and "EP rank 0: refused" in refused.stdout
    (tmp_path / "bad.log").write_text(f"INFO x {line}\nINFO y {line.replace('redundant_slots=8', 'redundant_slots=4')}\n")
    bad = run("audit", "--log", tmp_path / "bad.log", "--layout", tmp_path / "l.json", "--recorder", "off", check=False)
    assert bad.returncode == 1 and "FAIL  startup log line 2" in bad.stdout
    none = run("audit", "--layout", tmp_path / "l.json", check=False)
    assert none.returncode == 2 and "needs --url" in none.stderr and "Traceback" not in none.stderr


def test_several_scenes_fit_score_and_report(tmp_path, real_counts_paths):
    """One layout for two real scenes, with weights and the worst objective; score and report show
    every scene; --model names the routing groups and prices the redundant slots."""
    model = real_counts_paths[0].parents[1] / "models" / "deepseek-v3"
    a, b, c = real_counts_paths
    fit = json.loads(
        run(
            "fit",
            a,
            b,
            "--scene-weights",
            "0.7,0.3",
            "--objective",
            "worst",
            "--ep-size",
            16,
            "--redundant",
            16,
            "--model",
            model,
            "-o",
            tmp_path / "l.json",
            "--json",
            "-q",
        ).stdout
    )
    assert fit["expert_groups"] == 8 and fit["expert_groups_from"] == "--model"
    assert [s["weight"] for s in fit["scenes"]] == [0.7, 0.3] and "summary" not in fit
    assert fit["memory"]["redundant_bytes_per_rank"] == 58 * fit["memory"]["bytes_per_expert"]
    assert "tokens of KV cache per rank" in fit["memory"]["summary"]
    sc = json.loads(run("score", tmp_path / "l.json", a, b, c, "--json", "-q").stdout)
    assert [s["name"] for s in sc["scenes"]] == [a.stem, b.stem, c.stem]
    assert all(s["summary"]["new_static_train"]["worst"] < s["summary"]["old_train"]["worst"] for s in sc["scenes"])
    rep = json.loads(run("report", tmp_path / "l.json", a, c, "--model", model, "-o", tmp_path / "rep", "--json", "-q").stdout)
    assert len(rep["heatmaps"]) == 2 and all((tmp_path / "rep" / f"rank_load_heatmap-{n.stem}.png").is_file() for n in (a, c))
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Scenes" in md and f"## Scene {c.stem}" in md and "**Memory.**" in md and "static table: fitted" in md
    bad = run("fit", a, b, "--scene-weights", "1", "--ep-size", 16, "--redundant", 16, "-o", tmp_path / "x.json", check=False)
    assert bad.returncode == 2 and "1 scene weight(s) given for 2 counts file(s)" in bad.stderr
    assert not (tmp_path / "x.json").exists()
    conv = json.loads(run("convert", tmp_path / "l.json", "--to", "sglang", "-o", tmp_path / "s.json", "--json", "-q").stdout)
    assert conv["dropped"] == ["static_sources"]  # said, not silently lost
    text = run("inspect", a, "--model", model).stdout
    assert "One redundant slot per rank in each of 58 MoE layers costs 2.38 GiB" in text


def test_routing_groups_come_from_the_recorder_unless_a_flag_says_otherwise(tmp_path):
    data = skewed_counts(2, 2, 32, seed=9)
    recorded = write_counts(Counts(data, {"expert_groups": 4, "top_k": 4}), tmp_path / "rec.npz")
    args = ("--ep-size", 4, "--redundant", 4, "-o", tmp_path / "l.json", "--json", "-q")
    fit = json.loads(run("fit", recorded, *args).stdout)
    assert (fit["expert_groups"], fit["expert_groups_from"]) == (4, "counts metadata")
    assert json.loads((tmp_path / "l.json").read_text())["meta"]["top_k"] == 4
    fit = json.loads(run("fit", recorded, "--expert-groups", 2, *args).stdout)
    assert (fit["expert_groups"], fit["expert_groups_from"]) == (2, "--expert-groups")
    plain = write_counts(Counts(data), tmp_path / "plain.npz")
    assert json.loads(run("fit", plain, *args).stdout)["expert_groups_from"] == "default"
    other = write_counts(Counts(data, {"expert_groups": 8, "top_k": 4}), tmp_path / "other.npz")
    bad = run("fit", recorded, other, *args, check=False)
    assert bad.returncode == 2 and "record different routing" in bad.stderr
