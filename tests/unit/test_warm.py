"""The warm check of a cache scene (``ab.warm``, ``scene-eplb warm-check``): per DP engine from two /metrics
reads, each refusal in one line, and the measured share stamped into a record with its checksum renewed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_scene_eplb.ab.warm import check_warm, read_warm, stamp, warm_line, warm_meta
from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.formats import read_counts, write_counts
from vllm_scene_eplb.layouts.counts import Counts

from .test_bad_input import run


def page(*engines: tuple[float, float], external: float = 0.0) -> str:
    """A /metrics page in vLLM's names: (hits, queries) per DP engine, and a KV connector's own counter beside."""
    lines = ["# TYPE vllm:prefix_cache_hits_total counter"]
    for e, (hits, queries) in enumerate(engines):
        lines += [
            f'vllm:prefix_cache_hits_total{{engine="{e}",model_name="m"}} {hits}',
            f'vllm:prefix_cache_queries_total{{engine="{e}",model_name="m"}} {queries}',
            f'vllm:prefix_cache_hits_created{{engine="{e}",model_name="m"}} 1.7e+09',
            f'vllm:external_prefix_cache_hits_total{{engine="{e}",model_name="m"}} {external}',
        ]
    return "\n".join(lines) + "\n"


def test_the_share_moves_per_engine_between_the_reads_and_other_counters_are_not_read():
    reading = read_warm(page((100, 1000), (0, 0), external=5), page((1006, 2000), (450, 1000), external=9999))
    assert reading.engines == {"0": (906, 1000), "1": (450, 1000)} and reading.share == 1356 / 2000
    check_warm(reading, 0.45)
    with pytest.raises(SceneEplbError, match=r"under the scene's 0.9062 by more than 0.02 on engine 1 0.4500$"):
        check_warm(reading, 0.9062)
    check_warm(read_warm(page((0, 0)), page((887, 1000))), 0.9062)  # inside the margin
    with pytest.raises(SceneEplbError, match="engine 0 0.8850"):
        check_warm(read_warm(page((0, 0)), page((885, 1000))), 0.9062)


@pytest.mark.parametrize(
    "after, said",
    [
        (page((0, 0), (0, 0)), "no prefix-cache query between the two reads"),
        (page((0, 500), (0, 500)), "no prefix-cache hit between the two reads (1,000 tokens queried): prefix caching is off"),
        (page((906, 1000), (0, 0)), "DP engine(s) 1 served nothing between the reads"),
    ],
)
def test_a_cold_or_idle_server_is_refused_in_one_line(after, said):
    with pytest.raises(SceneEplbError, match=rf"^warm check: {said.replace('(', '[(]').replace(')', '[)]')}") as exc:
        check_warm(read_warm(page((0, 0), (0, 0)), after), 0.9062)
    assert "\n" not in str(exc.value)


def test_pages_that_are_not_vllms_or_went_backwards_are_refused():
    with pytest.raises(SceneEplbError, match="no vllm:prefix_cache_hits_total on this /metrics page"):
        read_warm("", page((1, 2)))
    with pytest.raises(SceneEplbError, match="went down between the reads: the server restarted"):
        read_warm(page((10, 20)), page((1, 2)))


def test_the_share_is_stamped_into_the_record_with_its_checksum_renewed(tmp_path):
    data = np.arange(2 * 3 * 8).reshape(2, 3, 8)
    path = write_counts(Counts(data, {"role": "prefill", "top_k": 2}), tmp_path / "counts.npz")
    reading = read_warm(page((0, 0), (0, 0)), page((906, 1000), (904, 1000)))
    stamp(str(path), warm_meta(reading, 0.9062))
    stamped = read_counts(path)
    assert np.array_equal(stamped.data, data) and stamped.meta["role"] == "prefill"
    assert stamped.meta["prefix_cache"] == {
        "hit_share": 0.905,
        "hits": 1810,
        "queries": 2000,
        "scene_share": 0.9062,
        "margin": 0.02,
        "engines": {"0": 0.906, "1": 0.904},
    }
    assert warm_line(stamped.meta["prefix_cache"]) == "prefix-cache hit share 0.9050 (scene 0.9062, 2 DP engines 0.9040-0.9060)"
    (tmp_path / "sglang.json").write_text(json.dumps({"logical_count": data.tolist()}))
    with pytest.raises(SceneEplbError, match="only a scene-eplb counts file"):
        stamp(str(tmp_path / "sglang.json"), {})
    with pytest.raises(SceneEplbError, match="not what warm-check writes"):
        warm_line({"hit_share": "high"})


def test_the_command_checks_two_saved_pages_and_stamps_on_request(tmp_path):
    before, after = tmp_path / "before.txt", tmp_path / "after.txt"
    before.write_text(page((0, 0)))
    after.write_text(page((450, 1000)))
    code, _, err = run("warm-check", str(before), str(after), "--share", "0.9062")
    assert code == 2 and err.strip() == (
        "scene-eplb: error: warm check: hit share 0.4500 overall, under the scene's 0.9062 by more than 0.02 on engine 0 0.4500"
    )
    counts = write_counts(Counts(np.ones((1, 2, 4), dtype=np.int64), {}), tmp_path / "c.npz")
    code, out, err = run("warm-check", str(before), str(after), "--share", "0.45", "--stamp", str(counts), "--json")
    assert code == 0 and json.loads(out)["hit_share"] == 0.45 and read_counts(counts).meta["prefix_cache"]["hits"] == 450
    code, _, err = run("warm-check", str(before), str(tmp_path / "missing.txt"), "--share", "0.45")
    assert code == 2 and "cannot read the /metrics page" in err
    code, _, err = run("warm-check", str(before), str(after), "--share", "1")
    assert code == 2 and "--share" in err
