"""Expert layouts (`physical_to_logical_map`), their geometry, validation and derived tables.

Slot p of a layer holds logical expert ``map[layer, p]``; EP rank r owns the contiguous slots
[r*S, (r+1)*S) with S = (E + R) / ep_size, and ranks are split evenly and contiguously over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import SceneEplbError
from ..fileio import canonical_json, sha256_hex

MAX_SIZE = 1 << 16  # experts, redundant slots, ranks or nodes: far beyond any model or cluster, and small enough to allocate


@dataclass(frozen=True)
class Geometry:
    """Expert-parallel geometry: E logical experts, R redundant slots, ep_size ranks on num_nodes nodes."""

    num_experts: int
    num_redundant: int
    ep_size: int
    num_nodes: int = 1

    def __post_init__(self) -> None:
        E, R, ep, nodes = self.num_experts, self.num_redundant, self.ep_size, self.num_nodes
        for name, value, low in (("num_experts", E, 1), ("num_redundant", R, 0), ("ep_size", ep, 1), ("nodes", nodes, 1)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not low <= value <= MAX_SIZE:
                raise SceneEplbError(f"{name} must be an integer in [{low}, {MAX_SIZE}], got {value!r}")
        if (E + R) % ep:
            raise SceneEplbError(f"experts + redundant slots ({E} + {R} = {E + R}) is not divisible by ep_size {ep}")
        if ep % nodes:
            raise SceneEplbError(f"ep_size {ep} is not divisible by nodes {nodes}")
        if R > E * (ep - 1):
            raise SceneEplbError(
                f"{R} redundant slots cannot be filled: at most ep_size - 1 = {ep - 1} extra replicas per expert "
                f"fit on distinct ranks ({E * (ep - 1)} in all)"
            )

    @property
    def num_physical(self) -> int:
        return self.num_experts + self.num_redundant

    @property
    def slots_per_rank(self) -> int:
        return self.num_physical // self.ep_size

    @property
    def ranks_per_node(self) -> int:
        return self.ep_size // self.num_nodes

    def rank_of_slot(self) -> np.ndarray:
        """EP rank owning each physical slot: int [P]."""
        return np.arange(self.num_physical) // self.slots_per_rank

    def node_of_rank(self) -> np.ndarray:
        """Node of each EP rank: int [ep_size]."""
        return np.arange(self.ep_size) // self.ranks_per_node

    def to_dict(self) -> dict:
        return {
            "num_experts": int(self.num_experts),
            "num_redundant": int(self.num_redundant),
            "ep_size": int(self.ep_size),
            "num_nodes": int(self.num_nodes),
        }


def map_problems(p2l: np.ndarray, geometry: Geometry) -> list[str]:
    """Every reason ``p2l`` [L, P] is not a valid layout for ``geometry``; empty when valid."""
    P, E = geometry.num_physical, geometry.num_experts
    if p2l.ndim != 2 or p2l.shape[0] == 0:
        return [f"physical_to_logical_map must be [layers, {P}], got shape {list(p2l.shape)}"]
    if p2l.shape[1] != P:
        return [
            f"physical_to_logical_map has {p2l.shape[1]} slots per layer, expected experts + redundant = "
            f"{E} + {geometry.num_redundant} = {P}"
        ]
    out_of_range = (p2l < 0) | (p2l >= E)
    if out_of_range.any():
        layer, slot = (int(i) for i in np.argwhere(out_of_range)[0])
        return [f"layer {layer} slot {slot}: logical id {int(p2l[layer, slot])} is outside [0, {E})"]
    problems = []
    present = np.zeros((p2l.shape[0], E), dtype=bool)
    np.put_along_axis(present, p2l, True, axis=1)
    for layer in np.flatnonzero(~present.all(axis=1))[:3]:
        missing = np.flatnonzero(~present[layer])
        problems.append(f"layer {int(layer)}: logical expert(s) {missing[:8].tolist()} have no slot")
    per_rank, dup = _duplicate_mask(p2l, geometry)
    for layer, rank, k in np.argwhere(dup)[:3]:
        problems.append(
            f"layer {int(layer)}: rank {int(rank)} holds logical expert {int(per_rank[layer, rank, k])} twice "
            "(a same-rank duplicate wastes a slot)"
        )
    return problems


def source_problems(p2l: np.ndarray, sources: np.ndarray, geometry: Geometry) -> list[str]:
    """Every reason ``sources`` [L, P] is not a static table for ``p2l``: each slot serves at least
    its own rank, and an expert's slots serve every source rank once (they sum to ep_size)."""
    if sources.shape != p2l.shape:
        return [f"static_sources must have the map's shape {list(p2l.shape)}, got {list(sources.shape)}"]
    if (sources < 1).any():
        layer, slot = (int(i) for i in np.argwhere(sources < 1)[0])
        return [
            f"static_sources: layer {layer} slot {slot} serves {int(sources[layer, slot])} source ranks (a replica serves at least its own rank)"
        ]
    L, E = p2l.shape[0], geometry.num_experts
    total = np.zeros((L, E), dtype=np.int64)
    np.add.at(total, (np.repeat(np.arange(L), p2l.shape[1]), p2l.ravel()), sources.ravel())
    bad = np.argwhere(total != geometry.ep_size)
    return [
        f"static_sources: layer {int(k)} expert {int(e)}'s replicas serve {int(total[k, e])} source ranks, not ep_size {geometry.ep_size}"
        for k, e in bad[:3]
    ]


def _duplicate_mask(p2l: np.ndarray, geometry: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's slots sorted [L, ep, S], and a mask [L, ep, S-1] of repeats within a rank."""
    per_rank = np.sort(p2l.reshape(p2l.shape[0], geometry.ep_size, geometry.slots_per_rank), axis=2)
    return per_rank, per_rank[:, :, 1:] == per_rank[:, :, :-1]


def same_rank_duplicates(p2l: np.ndarray, geometry: Geometry) -> int:
    """How many slots hold a second copy of an expert already on the same rank (wasted slots)."""
    return int(_duplicate_mask(p2l, geometry)[1].sum())


def replica_counts(p2l: np.ndarray, num_experts: int) -> np.ndarray:
    """Replicas per logical expert: int [L, E]."""
    L = p2l.shape[0]
    out = np.zeros((L, num_experts), dtype=np.int64)
    np.add.at(out, (np.repeat(np.arange(L), p2l.shape[1]), p2l.ravel()), 1)
    return out


def check_drafter_layers(layers, num_rows: int, moe_layers: tuple[int, ...]) -> tuple[int, ...]:
    """A drafter's MoE rows as a sorted tuple: distinct, the last rows of a ``num_rows``-row layer
    axis (after every target row), none of them a target MoE row; else the refusal."""
    rows = tuple(sorted(int(i) for i in layers))
    if rows and (rows != tuple(range(num_rows - len(rows), num_rows)) or set(rows) & set(moe_layers)):
        raise SceneEplbError(
            f"drafter_layers {list(rows)[:8]} must be the last rows of the {num_rows}-row layer axis, "
            "after every MoE layer of the target model"
        )
    return rows


def linear_map(geometry: Geometry, num_layers: int) -> np.ndarray:
    """The default placement engines start from: slot p holds p mod E, the same for every layer.

    It is the old layout that reports compare against; with R > 0 it can break the no-duplicate
    rule when a rank's slots wrap around E (then it is reported as such, not repaired).
    """
    row = np.arange(geometry.num_physical) % geometry.num_experts
    return np.tile(row, (num_layers, 1))


@dataclass(frozen=True)
class Layout:
    """A validated `physical_to_logical_map` [L, P] with its geometry and provenance.

    Shapes: L rows, the model's layer axis (dense layers included); E = ``geometry.num_experts``
    logical experts; R = ``geometry.num_redundant`` redundant slots; P = E + R physical slots per
    layer; S = P / ep_size slots per EP rank.

    - ``physical_to_logical_map``: int64 [L, P]. Slot ``p`` of row ``l`` holds logical expert
      ``physical_to_logical_map[l, p]`` in [0, E); EP rank ``r`` owns slots [r*S, (r+1)*S)
      (``geometry.rank_of_slot()``). Checked: every expert has a slot in every row, and no rank
      holds one expert twice.
    - ``geometry``: ``Geometry`` (E, R, ep_size, num_nodes).
    - ``moe_layers``: tuple of row indices, sorted: the rows that are MoE layers (the rest are
      dense, kept only so the layer axis matches the counts and the model); every target row when
      not given.
    - ``meta``: dict, the provenance ``fit`` writes (fingerprint, fitter version, source counts
      digests, scene weights, options, model, role, and the expected score under ``EXPECTED_KEY``).
    - ``static_sources``: int64 [L, P] or None. Under ``static`` dispatch, how many source ranks
      each slot serves (at least 1, its own rank; an expert's slots sum to ep_size), as the fitter
      chose it; ``dispatch.static_table`` derives the table [L, ep, E] from it. None: the table is
      the even split.
    - ``drafter_layers``: tuple of row indices, the last rows of the map: a speculative drafter's
      own MoE layers (DeepSeek's MTP layer, model layer ``num_hidden_layers``), placed by rows of
      their own after the target's layer axis (``layouts.drafter``); empty: none. ``moe_layers``
      stays the target's, so whatever reads a layout's MoE rows reads the target's.

    Example: E = 4 experts, R = 2, ep_size = 2 (P = 6, S = 3), one layer where experts 0 and 1 are
    hot and get a second replica each::

        physical_to_logical_map = [[0, 1, 2,  0, 3, 1]]   # rank 0: slots 0-2; rank 1: slots 3-5
        replica_counts()        = [[2, 2, 1, 1]]          # int [L, E]: replicas per expert
        static_sources          = [[1, 1, 2,  1, 2, 1]]   # expert 2's one slot serves both ranks
        static_table(...)       = [[[0, 1, 2, 4],         # rank 0's tokens of expert e go to slot ...
                                    [3, 5, 2, 4]]]        # rank 1's: its own replicas of 0 and 1
    """

    physical_to_logical_map: np.ndarray
    geometry: Geometry
    moe_layers: tuple[int, ...] = None  # type: ignore[assignment]  # given as None: every row (a tuple once built)
    meta: dict = field(default_factory=dict)
    static_sources: np.ndarray | None = None
    drafter_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        p2l = np.asarray(self.physical_to_logical_map)
        if not np.issubdtype(p2l.dtype, np.integer):
            raise SceneEplbError(f"physical_to_logical_map must hold integers, got dtype {p2l.dtype}")
        p2l = np.ascontiguousarray(p2l, dtype=np.int64)
        problems = map_problems(p2l, self.geometry)
        if problems:
            raise SceneEplbError("; ".join(problems))
        object.__setattr__(self, "physical_to_logical_map", p2l)
        if self.static_sources is not None:
            sources = np.asarray(self.static_sources)
            if not np.issubdtype(sources.dtype, np.integer):
                raise SceneEplbError(f"static_sources must hold integers, got dtype {sources.dtype}")
            sources = np.ascontiguousarray(sources, dtype=np.int64)
            problems = source_problems(p2l, sources, self.geometry)
            if problems:
                raise SceneEplbError("; ".join(problems))
            object.__setattr__(self, "static_sources", sources)
        if self.moe_layers is None:  # every target row (the rows before the drafter's)
            object.__setattr__(self, "moe_layers", tuple(range(p2l.shape[0] - len(set(self.drafter_layers)))))
        else:
            layers = tuple(int(i) for i in self.moe_layers)
            if any(i < 0 or i >= p2l.shape[0] for i in layers) or len(set(layers)) != len(layers):
                raise SceneEplbError(f"moe_layers {list(layers)[:8]}... must be distinct rows of the {p2l.shape[0]}-layer map")
            object.__setattr__(self, "moe_layers", tuple(sorted(layers)))
        object.__setattr__(self, "drafter_layers", check_drafter_layers(self.drafter_layers, p2l.shape[0], self.moe_layers))

    @property
    def num_layers(self) -> int:
        return int(self.physical_to_logical_map.shape[0])

    @property
    def num_target_layers(self) -> int:
        """The target model's rows (the layer axis before the drafter's rows)."""
        return self.num_layers - len(self.drafter_layers)

    def drafter_view(self) -> Layout:
        """The same map with the drafter's rows as its MoE rows: what scores, tables and loaders read
        of the drafter's layers, by the same code that reads the target's."""
        return Layout(self.physical_to_logical_map, self.geometry, self.drafter_layers, self.meta, self.static_sources)

    def replica_counts(self) -> np.ndarray:
        return replica_counts(self.physical_to_logical_map, self.geometry.num_experts)

    def static_sources_at(self, rows) -> np.ndarray | None:
        """The fitted static table's ``rows`` [n, P] (source ranks per slot), or None without one."""
        return None if self.static_sources is None else self.static_sources[rows]

    def digest(self) -> str:
        """Content hash of the map, geometry and static table (when fitted): what a running server
        reports as its layout hash."""
        doc = {"geometry": self.geometry.to_dict(), "map": self.physical_to_logical_map.tolist()}
        if self.static_sources is not None:
            doc["static_sources"] = self.static_sources.tolist()
        return sha256_hex(canonical_json(doc))[:16]

    def check_model(
        self,
        num_moe_layers: int,
        num_experts: int,
        ep_size: int,
        model_moe_layers: tuple[int, ...] | None = None,
        model_num_layers: int | None = None,
    ) -> None:
        """Refuse a layout made for another model or parallel geometry. Given the model's MoE layer
        ids and layer count, a layout with the model's layer axis must have MoE rows at those ids."""
        problems = []
        rows = self.num_target_layers
        if len(self.moe_layers) != num_moe_layers:
            problems.append(f"layout has {len(self.moe_layers)} MoE layers, the model has {num_moe_layers}")
        elif model_moe_layers is not None and rows == model_num_layers and tuple(self.moe_layers) != tuple(model_moe_layers):
            problems.append(
                f"layout's MoE rows {list(self.moe_layers)} differ from the model's MoE layers {list(model_moe_layers)}"
            )
        if self.geometry.num_experts != num_experts:
            problems.append(f"layout is for {self.geometry.num_experts} experts, the model has {num_experts}")
        if self.geometry.ep_size != ep_size:
            problems.append(f"layout is for ep_size {self.geometry.ep_size}, the server runs ep_size {ep_size}")
        if problems:
            raise SceneEplbError("layout does not match the model: " + "; ".join(problems))
