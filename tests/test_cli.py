"""The `scene-eplb` command as a user runs it: real subprocesses, real files."""

import json
import subprocess
import sys

import pytest

from vllm_scene_eplb.counts import Counts
from vllm_scene_eplb.formats import write_counts

from .conftest import skewed_counts


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


def _bad_inputs(tmp_path, counts_file):
    """(name, command args, file expected in the message, text expected) for each malformed input."""
    good = tmp_path / "good.json"
    run("fit", counts_file, "--ep-size", 4, "--redundant", 8, "-o", good, "-q")
    doc = json.loads(good.read_text())
    cases = []

    def counts_json(name, value):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"logical_count": value}) if not isinstance(value, str) else value)
        return p

    def layout_json(name, mutate):
        d = json.loads(json.dumps(doc))
        mutate(d)
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(d))
        return p

    def bare(name, rows):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"physical_to_logical_map": rows}))
        return p

    fit_args = ["--ep-size", 4, "--redundant", 8]
    cases.append(("wrong shape", ["fit", counts_json("shape", [[[[1]]]]), *fit_args], "must be [T, L, E]"))
    cases.append(("float counts", ["inspect", counts_json("float", [[1.5, 2]])], "fractional"))
    cases.append(("negative", ["inspect", counts_json("neg", [[1, -2]])], "negative"))
    cases.append(("NaN", ["inspect", counts_json("nan", '{"logical_count": [[1, NaN]]}')], "non-finite"))
    cases.append(("truncated counts", ["inspect", counts_json("trunc", '{"logical_count": [[1, 2], [3')], "not valid JSON"))
    row = list(range(32)) + list(range(8))
    cases.append(
        (
            "id out of range",
            ["validate", bare("range", [row[:-1] + [99]]), "--ep-size", 4, "--num-experts", 32],
            "outside [0, 32)",
        )
    )
    cases.append(
        (
            "missing expert",
            ["validate", bare("missing", [row[:15] + [25] + row[16:]]), "--ep-size", 4, "--num-experts", 32],
            "have no slot",
        )
    )
    cases.append(
        ("same-rank duplicate", ["validate", bare("dup", [[0, 0] + row[2:32] + [1] + row[33:]]), "--ep-size", 4], "twice")
    )
    cases.append(
        ("geometry does not divide", ["fit", counts_file, "--ep-size", 3, "--redundant", 8], "not divisible by ep_size 3")
    )
    cases.append(("bare layout geometry", ["validate", bare("div", [row]), "--ep-size", 3], "not divisible"))
    truncated = tmp_path / "trunc_layout.json"
    truncated.write_text(good.read_text()[:200])
    cases.append(("truncated layout", ["validate", truncated], "not valid JSON"))
    cases.append(
        ("checksum mismatch", ["validate", layout_json("tamper", lambda d: d["meta"].update(role="decode"))], "checksum mismatch")
    )
    npz = tmp_path / "trunc.npz"
    npz.write_bytes(counts_file.read_bytes()[:300])
    cases.append(("truncated npz", ["inspect", npz], "truncated or corrupt"))
    cases.append(("counts given as layout", ["validate", counts_json("asl", [[1, 2]])], "counts file, not a layout"))
    cases.append(("no such file", ["inspect", tmp_path / "nope.json"], "no such file"))
    return cases


def test_every_bad_input_gets_one_line_no_traceback_and_no_output(tmp_path, counts_file):
    for name, args, text in _bad_inputs(tmp_path, counts_file):
        out = tmp_path / f"out-{name.replace(' ', '_')}"
        cmd = list(args)
        if cmd[0] in ("fit",):
            cmd += ["-o", out]
        proc = run(*cmd, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (name, proc.stderr)
        assert "Traceback" not in proc.stderr, name
        assert text in lines[-1], (name, lines)
        assert lines[-1].startswith("scene-eplb: error: "), (name, lines)
        assert not out.exists(), name


def test_convert_and_fit_write_nothing_on_bad_input(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"logical_count": [[1, -1]]}))
    for args in (
        ["convert", bad, "--to", "native", "-o", tmp_path / "o.npz"],
        ["fit", bad, "--ep-size", 1, "--redundant", 0, "-o", tmp_path / "o.json"],
    ):
        proc = run(*args, check=False)
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
    assert ok["ok"] and len(ok["checks"]) == 6
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
