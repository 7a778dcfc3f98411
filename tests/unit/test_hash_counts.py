"""`scene-eplb hash-counts`: a tiny DeepSeek-V4's hash layers predicted from token ids, a histogram or
text prompts into a counts file `fit` and `inspect` take, or filled into a record that missed them;
bad input is one line and writes nothing."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_scene_eplb.formats import read_counts, write_counts
from vllm_scene_eplb.hash_layers.hash_counts import apportion
from vllm_scene_eplb.hash_layers.hash_routing import read_hash_tables
from vllm_scene_eplb.layouts.counts import Counts
from vllm_scene_eplb.rig.tiny_deepseek_v4 import TinyDeepseekV4Spec, make_tiny_deepseek_v4

from ..conftest import cli
from .test_bad_input import assert_one_line_error, run

SPEC = TinyDeepseekV4Spec()
HASHED = list(SPEC.hash_layers)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_tiny_deepseek_v4(tmp_path_factory.mktemp("tiny-v4"), SPEC)


@pytest.fixture(scope="module")
def requests() -> list[list[int]]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, SPEC.vocab_size, int(n)).tolist() for n in rng.integers(0, 80, 30)]


def _bincounts(model: Path, ids: np.ndarray) -> np.ndarray:
    tables = read_hash_tables(model)
    return np.stack([np.bincount(t[ids].ravel(), minlength=SPEC.num_experts) for t in tables.tables])


def test_token_ids_json_jsonl_and_histogram_give_the_exact_counts(tmp_path, model, requests):
    (tmp_path / "ids.json").write_text(json.dumps(requests))
    (tmp_path / "ids.jsonl").write_text("\n".join(json.dumps(r) for r in requests) + "\n\n")
    flat = np.concatenate([np.asarray(r, dtype=np.int64) for r in requests])
    (tmp_path / "hist.json").write_text(json.dumps(np.bincount(flat).tolist()))
    outs, texts = [], []
    for option, source in (("--token-ids", "ids.json"), ("--token-ids", "ids.jsonl"), ("--histogram", "hist.json")):
        out = tmp_path / f"{source}.npz"
        code, stdout, err = run("hash-counts", "--model", model, option, tmp_path / source, "-o", out, "--role", "prefill", "-q")
        assert code == 0, err
        outs.append(read_counts(out))
        texts.append(stdout)
    want = _bincounts(model, flat)
    for c in outs:
        assert c.data.shape == (1, SPEC.num_layers, SPEC.num_experts)
        assert np.array_equal(c.data[0, HASHED], want) and not c.data[0, SPEC.num_hash_layers :].any()
        assert c.meta["predicted_layers"] == HASHED and c.meta["predicted_tokens"] == flat.size
        assert c.meta["moe_layers"] == SPEC.moe_layers and c.meta["top_k"] == SPEC.top_k and c.meta["role"] == "prefill"
    assert len({c.meta["tokens_sha256"] for c in outs}) == 1
    assert f"tokens: {flat.size} from token ids of 30 requests" in texts[0] and f"tokens: {flat.size} from histogram" in texts[2]


def test_fit_and_inspect_take_a_prediction_and_say_what_it_is(tmp_path, model, requests):
    (tmp_path / "ids.json").write_text(json.dumps(requests))
    counts = tmp_path / "hash.npz"
    assert run("hash-counts", "--model", model, "--token-ids", tmp_path / "ids.json", "-o", counts, "-q")[0] == 0
    code, out, err = run(
        "fit", counts, "--ep-size", "4", "--redundant", "4", "-o", tmp_path / "layout.json", "--model", model, "-q"
    )
    assert code == 0, err
    assert "layers [0, 1, 2] predicted from" in out and "MoE layers [3, 4] have no counts in any scene" in out
    layout = json.loads((tmp_path / "layout.json").read_text())
    assert layout["moe_layers"] == SPEC.moe_layers and len(layout["physical_to_logical_map"]) == SPEC.num_layers
    code, out, err = run("inspect", counts, "--json", "-q")
    assert code == 0, err
    assert json.loads(out)["meta"]["predicted_layers"] == HASHED and "predicted from" in json.loads(out)["notes"][0]


SCORED = [layer for layer in SPEC.moe_layers if layer not in HASHED]


def _record(path: Path, tokens: int, physical: bool = False) -> Path:
    """A record of the tiny V4 whose hash layers came out empty: ``tokens`` tokens over five written
    entries (entry 2 an unwritten ring entry), each routed to top_k experts of a skewed mix in every
    score-routed layer, so the record routed ``tokens`` tokens a layer."""
    rng = np.random.default_rng(5)
    mix = rng.dirichlet(np.full(SPEC.num_experts, 0.3))
    weights = np.array([3, 2, 0, 2, 1, 1])
    per_entry = tokens * weights // weights.sum()
    per_entry[0] += tokens - per_entry.sum()
    data = np.zeros((len(weights), SPEC.num_layers, SPEC.num_experts), dtype=np.int64)
    for entry, n in enumerate(per_entry):
        data[entry, SCORED] = rng.multinomial(n * SPEC.top_k, mix, size=len(SCORED))
    phys = np.concatenate([data, np.zeros_like(data[..., :4])], axis=2) if physical else None
    return write_counts(Counts(data, {"model": "tiny", "role": "prefill", "moe_layers": SPEC.moe_layers}, phys), path)


def _flat(requests: list[list[int]]) -> np.ndarray:
    return np.concatenate([np.asarray(r, dtype=np.int64) for r in requests])


def test_fill_puts_the_exact_prediction_into_a_record_that_missed_the_hash_layers(tmp_path, model, requests):
    record = _record(tmp_path / "record.npz", _flat(requests).size, physical=True)
    (tmp_path / "ids.json").write_text(json.dumps(requests))
    out = tmp_path / "filled.npz"
    code, stdout, err = run("inspect", record, "--model", model, "-q")
    assert_one_line_error(code, err, "MoE layers [0, 1, 2] (per --model) are all zero", "inspect")
    assert f"`scene-eplb hash-counts --model {model} --fill {record} --token-ids TOKENS -o FILLED`" in err and stdout
    code, stdout, err = run(
        "hash-counts", "--model", model, "--token-ids", tmp_path / "ids.json", "--fill", record, "-o", out, "-q"
    )
    assert code == 0, err
    before, after = read_counts(record), read_counts(out)
    flat = _flat(requests)
    assert np.array_equal(after.total()[HASHED], _bincounts(model, flat))
    scored = SCORED
    assert np.array_equal(after.data[:, scored], before.data[:, scored])
    assert not after.data[2].any() and after.physical is None and "dropped physical_count" in stdout
    tokens = before.data[:, scored].sum(axis=(1, 2))
    share = after.data[:, HASHED].sum(axis=(1, 2)) / after.data[:, HASHED].sum()
    assert np.allclose(share, tokens / tokens.sum(), atol=1e-3)
    assert after.meta["predicted_layers"] == HASHED and after.meta["role"] == "prefill"
    assert after.meta["recorded_tokens"] == pytest.approx(tokens.sum() / (SPEC.top_k * len(scored))) == flat.size
    assert "(ratio 1: within [0.9, 1.1]" in stdout
    code, stdout, _ = run("inspect", out, "--model", model, "-q")
    assert code == 0 and "all zero" not in stdout and "predicted from" in stdout


@settings(max_examples=80, deadline=None)
@given(
    total=st.lists(st.integers(0, 2**53), min_size=1, max_size=6),
    weights=st.lists(st.integers(0, 2**40), min_size=1, max_size=8).filter(any),
)
def test_apportion_keeps_every_total_and_each_share_within_one(total, weights):
    t, w = np.array(total, dtype=np.int64), np.array(weights, dtype=np.int64)
    parts = apportion(t, w)
    assert parts.shape == (len(w), len(t)) and np.array_equal(parts.sum(axis=0), t) and (parts >= 0).all()
    exact = [[x * wi / sum(weights) for x in total] for wi in weights]
    assert np.all(np.abs(parts - np.array(exact)) <= 1 + 1e-6 * np.array(exact))


def test_prompts_are_tokenized_by_the_models_tokenizer(tmp_path, model):
    from transformers import AutoTokenizer

    prompts = ["the quick brown fox", "jumps over the lazy dog again and again"]
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": p}) for p in prompts))
    out = tmp_path / "p.npz"
    code, _, err = run("hash-counts", "--model", model, "--prompts", tmp_path / "prompts.jsonl", "-o", out, "-q")
    assert code == 0, err
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    ids = np.concatenate([tokenizer(p, add_special_tokens=True)["input_ids"] for p in prompts])
    assert np.array_equal(read_counts(out).data[0, HASHED], _bincounts(model, ids))


def test_prompts_without_transformers_are_one_line(tmp_path, model, monkeypatch):
    (tmp_path / "prompts.json").write_text(json.dumps(["hello"]))
    monkeypatch.setitem(sys.modules, "transformers", None)
    code, _, err = run("hash-counts", "--model", model, "--prompts", tmp_path / "prompts.json", "-o", tmp_path / "p.npz", "-q")
    assert_one_line_error(code, err, "needs the transformers package", "no transformers")
    assert not (tmp_path / "p.npz").exists()


# Tokens given over the tokens the record routed, and whether --fill refuses them: far short (a few
# requests of the run), just inside the band either side, sampled plus drafted (accepted drafts twice).
RATIOS = {
    "a few requests": (0.006, True),
    "just short": (0.91, False),
    "just over": (1.09, False),
    "sampled plus drafted": (1.5, True),
}


@pytest.mark.parametrize("name", RATIOS)
def test_fill_refuses_tokens_outside_the_band_and_writes_nothing_unless_accepted(tmp_path, model, requests, name):
    flat = _flat(requests)
    record = _record(tmp_path / "record.npz", flat.size)
    ratio, refused = RATIOS[name]
    given = np.resize(flat, max(1, round(ratio * flat.size)))
    (tmp_path / "ids.json").write_text(json.dumps([given.tolist()]))
    out = tmp_path / "filled.npz"
    args = ("hash-counts", "--model", model, "--token-ids", tmp_path / "ids.json", "--fill", record, "-o", out, "-q")
    done = cli(*args)
    if not refused:
        assert done.returncode == 0 and f"(ratio {given.size / flat.size:.3g}: within [0.9, 1.1]" in done.stdout, done.stderr
        return
    assert_one_line_error(done.returncode, done.stderr, f"the tokens given ({given.size}) are", name)
    assert f"the {flat.size:.1f} tokens the record routed" in done.stderr and "--accept-token-ratio" in done.stderr
    assert not out.exists()
    done = cli(*args, "--accept-token-ratio", "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["token_ratio"] == pytest.approx(given.size / flat.size) and payload["token_ratio_band"] == [0.9, 1.1]
    assert np.array_equal(read_counts(out).total()[HASHED], _bincounts(model, given))


def test_accept_token_ratio_without_a_record_is_refused(tmp_path, model, requests):
    (tmp_path / "ids.json").write_text(json.dumps(requests))
    out = tmp_path / "hash.npz"
    done = cli("hash-counts", "--model", model, "--token-ids", tmp_path / "ids.json", "-o", out, "--accept-token-ratio", "-q")
    assert_one_line_error(done.returncode, done.stderr, "--accept-token-ratio applies to --fill only", "no --fill")
    assert not out.exists()


def test_help_says_which_tokens_each_node_computes_and_where_they_are_an_estimate():
    code, out, _ = run("hash-counts", "--help")
    text = " ".join(out.split())
    assert code == 0 and "--fill" in text and "--accept-token-ratio" in text
    assert "prompt past its prefix-cache hit" in text and "a full hit still computes that token" in text
    assert "each token it samples but the last" in text and "after a preemption" in text
    assert "accepted draft once, in its verify pass" in text and "count it twice" in text
    assert "D's counts are an estimate" in text and "vLLM gives no client the drafts" in text
    qualified = {"exact for the tokens given", "exact with the hits known", "exact without a drafter when"}
    for found in re.finditer("exact", text):  # "exact" only where it holds, said with its condition
        assert any(text.startswith(q, found.start()) for q in qualified), text[found.start() : found.start() + 60]
    code, out, _ = run("--help")
    assert code == 0 and "exact" not in next(x for x in out.splitlines() if "hash-counts" in x)


BAD = {
    "id past the vocabulary": ("--token-ids", "ids.json", [[1, 2], [3, 512]], "request 1's token ids has a value above 511"),
    "not JSON": ("--token-ids", "ids.json", "[[1, 2]", "the file is not valid JSON"),
    "not a list of requests": ("--token-ids", "ids.json", {"a": 1}, "expected a JSON list"),
    "a request not a list": ("--token-ids", "ids.jsonl", "[1]\n5\n", "request 1 is int, not a list of token ids"),
    "bad JSONL line": ("--token-ids", "ids.jsonl", "[1]\n[2,\n", "line 2 is not valid JSON"),
    "no tokens": ("--token-ids", "ids.json", [[], []], "hold no token"),
    "negative histogram": ("--histogram", "h.json", [1, -1], "a negative value -1"),
    "histogram past the vocabulary": ("--histogram", "h.json", [0] * 600 + [1], "token id 600, outside the vocabulary"),
    "prompt not a string": ("--prompts", "p.json", [["a"]], "prompt 0 is list"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_tokens_are_one_line_and_write_nothing(tmp_path, model, name):
    option, file, content, expected = BAD[name]
    (tmp_path / file).write_text(content if isinstance(content, str) else json.dumps(content))
    out = tmp_path / "out.npz"
    code, _, err = run("hash-counts", "--model", model, option, tmp_path / file, "-o", out, "-q")
    assert_one_line_error(code, err, expected, name)
    assert not out.exists()


def test_a_bad_model_or_record_is_one_line_and_writes_nothing(tmp_path, model):
    (tmp_path / "ids.json").write_text(json.dumps([[1, 2, 3]]))
    out = tmp_path / "out.npz"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((model / "config.json").read_text())
    (broken / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:-1000])
    no_hash = tmp_path / "no-hash"
    no_hash.mkdir()
    (no_hash / "config.json").write_text(json.dumps({**json.loads((model / "config.json").read_text()), "num_hash_layers": 0}))
    recorded = _record(tmp_path / "recorded.npz", 50)
    full = read_counts(recorded)
    write_counts(Counts(full.data + 1, full.meta), tmp_path / "full.npz")
    other = write_counts(Counts(np.ones((2, 3, SPEC.num_experts), dtype=np.int64)), tmp_path / "other.npz")
    cases = [
        (("--model", broken), "outside the file's"),
        (("--model", no_hash), "config has no num_hash_layers"),
        (("--model", model, "--fill", tmp_path / "full.npz"), "hash layers [0, 1, 2] hold"),
        (("--model", model, "--fill", other), "[L=3, E=64], the model [L=5, E=64]"),
        (("--model", model, "--fill", tmp_path / "ids.json"), "not a counts file"),
    ]
    for args, expected in cases:
        code, _, err = run("hash-counts", *args, "--token-ids", tmp_path / "ids.json", "-o", out, "-q")
        assert_one_line_error(code, err, expected, str(args))
        assert not out.exists()


@pytest.mark.parametrize("predicted", ["0,1,2", [0, 9], [True]], ids=["a string", "a layer past the axis", "a boolean"])
def test_a_counts_file_whose_predicted_layers_are_not_layers_is_refused(tmp_path, predicted):
    path = write_counts(Counts(np.ones((1, 3, 4), dtype=np.int64), {"predicted_layers": predicted}), tmp_path / "c.npz")
    code, _, err = run("inspect", path, "-q")
    assert_one_line_error(code, err, "predicted_layers must be a list of layer indices in [0, 3)", str(predicted))
