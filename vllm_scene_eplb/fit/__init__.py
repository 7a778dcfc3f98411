"""The offline fitter, one module per stage:

1. ``replicas``: how many slots each expert gets (``allocate_replicas``);
2. ``placement``: which rank each replica goes to, with the group hedge (``place``);
3. ``refinement``: bounded swaps between the hottest and a cooler rank (``refine``);
4. ``static_table``: which source ranks each replica serves under ``static`` dispatch;
5. ``several_scenes``: one layout for a weighted mix of scenes (``fit_scenes``);

with ``one_scene`` running stages 1-4 for one set of weights (``fit_map``, robust mode), and
``layout_fit`` turning counts into a validated ``Layout`` with its fingerprint (``fit``). Every step
is vectorised across layers (one numpy op handles all L layers), so a 58-layer model fits in tens
of milliseconds, and every choice is deterministic: the same counts and options give the same
layout and fingerprint.
"""

from .layout_fit import fingerprint, fit
from .one_scene import fit_map, fit_weights, pick_per_layer
from .options import FITTER_VERSION, OBJECTIVES, ROBUST_KAPPAS, WORST_REFIT_SHARE, FitOptions, Fitted
from .placement import hedge_kernel, place
from .refinement import refine
from .replicas import allocate_replicas
from .several_scenes import fit_scenes
from .static_table import even_sources, fit_static_table, move_sources, table_sources

__all__ = [
    "FITTER_VERSION",
    "OBJECTIVES",
    "ROBUST_KAPPAS",
    "WORST_REFIT_SHARE",
    "FitOptions",
    "Fitted",
    "allocate_replicas",
    "even_sources",
    "fingerprint",
    "fit",
    "fit_map",
    "fit_scenes",
    "fit_static_table",
    "fit_weights",
    "hedge_kernel",
    "move_sources",
    "pick_per_layer",
    "place",
    "refine",
    "table_sources",
]
