"""Where the benchmarks find the real counts: the repository's data/ folder, or $SCENE_EPLB_DATA."""

import os
from pathlib import Path

DEFAULT = os.environ.get("SCENE_EPLB_DATA", str(Path(__file__).resolve().parents[1] / "data" / "deepseek_v3_counts"))
