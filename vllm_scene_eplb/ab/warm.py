"""A cache scene recorded warm, proven from the engine's own numbers (``scene-eplb warm-check``).

A scene with a shared prefix (``PREFIX_SHARE`` > 0) must be recorded with that prefix already in every
DP engine's prefix cache, so cold prefix computation never enters the recorded distribution. The
proof is vLLM's own counters on ``/metrics`` (vLLM 0.23's ``PrometheusStatLogger``):
``vllm:prefix_cache_queries`` (tokens looked up) and ``vllm:prefix_cache_hits`` (tokens found), one
series per DP engine (label ``engine``), read twice: between the reads each engine's hits over its
queries is its hit share. vLLM registers both whether prefix caching is on or not, so a counter that
exists proves nothing; hits that moved do.

The check refuses (one line) when no token was queried between the reads, when no hit moved (prefix
caching off, or nothing seeded), when a DP engine served nothing between them (its cache unchecked),
or when any engine's share falls under the scene's by more than the margin (0.02 by default: a block
of 512 tokens, the compressed cache's hit unit on DeepSeek-V4, is 0.4% of a 131,076-token prompt).
The measured share is what a warm record's counts file carries in its metadata (``PREFIX_CACHE_KEY``),
which ``fit`` and ``report`` print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import SceneEplbError
from ..formats import read_counts, write_counts
from ..formats.counts import COUNTS_FORMAT, PREFIX_CACHE_KEY
from ..layouts.counts import Counts
from .engine_tokens import series

HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
ENGINE = re.compile(r'(?:^|,)engine="([^"]*)"')
MARGIN = 0.02


def read_page(path: str) -> str:
    """A saved /metrics page, or one line saying why it cannot be read."""
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SceneEplbError(f"cannot read the /metrics page: {exc}", path) from None


def _per_engine(metrics_text: str, name: str) -> dict[str, float]:
    """A counter's value per DP engine (its ``engine`` label; "" without one) on a /metrics page."""
    samples = series(metrics_text, name)
    if not samples:
        raise SceneEplbError(f"no {name} on this /metrics page: not a vLLM server's /metrics")
    out: dict[str, float] = {}
    for labels, value in samples:
        match = ENGINE.search(labels)
        engine = match.group(1) if match else ""
        out[engine] = out.get(engine, 0.0) + value
    return out


@dataclass(frozen=True)
class WarmReading:
    """Prefix-cache hits and queries that moved between two reads of /metrics, per DP engine."""

    engines: dict[str, tuple[int, int]]  # engine -> (hits, queries)

    @property
    def hits(self) -> int:
        return sum(h for h, _ in self.engines.values())

    @property
    def queries(self) -> int:
        return sum(q for _, q in self.engines.values())

    @property
    def share(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def engine_shares(self) -> dict[str, float]:
        return {e: h / q for e, (h, q) in self.engines.items() if q}


def read_warm(before: str, after: str) -> WarmReading:
    """The hits and queries each DP engine's counters moved between the ``before`` and ``after`` pages."""
    pages = [(_per_engine(page, HITS), _per_engine(page, QUERIES)) for page in (before, after)]
    engines = sorted(set(pages[1][1]) | set(pages[1][0]), key=lambda e: (len(e), e))
    moved = {}
    for e in engines:
        hits = round(pages[1][0].get(e, 0.0) - pages[0][0].get(e, 0.0))
        queries = round(pages[1][1].get(e, 0.0) - pages[0][1].get(e, 0.0))
        if hits < 0 or queries < 0:
            raise SceneEplbError(f"engine {e or '0'}'s prefix-cache counters went down between the reads: the server restarted?")
        moved[e] = (hits, queries)
    return WarmReading(moved)


def check_warm(reading: WarmReading, share: float, margin: float = MARGIN) -> None:
    """Refuse, in one line, a reading that does not prove the scene's ``share`` warm (module docstring)."""
    if not 0 < share < 1:
        raise SceneEplbError(f"the scene's prefix share must lie in (0, 1), got {share}: a cold scene needs no warm check")
    want = f"the scene's share {share:g} (margin {margin:g})"
    if reading.queries == 0:
        raise SceneEplbError(f"warm check: no prefix-cache query between the two reads: the server served nothing; {want}")
    if reading.hits == 0:
        raise SceneEplbError(
            f"warm check: no prefix-cache hit between the two reads ({reading.queries:,} tokens queried): prefix caching "
            f"is off or nothing was seeded; {want}"
        )
    idle = [e or "0" for e, (_, q) in reading.engines.items() if q == 0]
    if idle:
        raise SceneEplbError(
            f"warm check: DP engine(s) {', '.join(idle)} served nothing between the reads: their caches are unchecked"
        )
    cold = {e or "0": s for e, s in reading.engine_shares().items() if s < share - margin}
    if cold:
        said = ", ".join(f"engine {e} {s:.4f}" for e, s in cold.items())
        raise SceneEplbError(
            f"warm check: hit share {reading.share:.4f} overall, under the scene's {share:g} by more than {margin:g} on {said}"
        )


def warm_meta(reading: WarmReading, share: float, margin: float = MARGIN) -> dict:
    """What a warm record's metadata carries (``PREFIX_CACHE_KEY``): the measured share, per DP engine too."""
    return {
        "hit_share": round(reading.share, 6),
        "hits": reading.hits,
        "queries": reading.queries,
        "scene_share": share,
        "margin": margin,
        "engines": {e or "0": round(s, 6) for e, s in reading.engine_shares().items()},
    }


def stamp(counts_path: str, meta: dict) -> None:
    """Rewrite a scene-eplb counts file with ``meta`` under ``PREFIX_CACHE_KEY`` (atomically, its checksum
    renewed; everything else as it was)."""
    counts = read_counts(counts_path)
    if counts.meta.get("format") != COUNTS_FORMAT:
        raise SceneEplbError("only a scene-eplb counts file (.npz, what the recorder dumps) carries the warm check", counts_path)
    write_counts(Counts(counts.data, {**counts.meta, PREFIX_CACHE_KEY: meta}, counts.physical, counts.sources), counts_path)


def warm_line(meta: object) -> str:
    """A warm record's metadata (``warm_meta``) in one line, what ``fit`` and ``report`` print."""
    numbers = isinstance(meta, dict) and all(type(meta.get(k)) in (int, float) for k in ("hit_share", "scene_share"))
    engines = meta.get("engines", {}) if isinstance(meta, dict) else None
    if not numbers or not isinstance(engines, dict) or not all(type(v) in (int, float) for v in engines.values()):
        raise SceneEplbError(f"the counts metadata's {PREFIX_CACHE_KEY} is not what warm-check writes: {meta!r:.200}")
    assert isinstance(meta, dict)
    shares = list(engines.values())
    spread = f", {len(shares)} DP engines {min(shares):.4f}-{max(shares):.4f}" if len(shares) > 1 else ""
    return f"prefix-cache hit share {meta['hit_share']:.4f} (scene {meta['scene_share']:g}{spread})"
