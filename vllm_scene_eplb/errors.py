"""The one exception type the project raises for bad input, so the CLI can print one clean line."""

from __future__ import annotations

import os


class SceneEplbError(Exception):
    """A user-facing failure: what is wrong and, when a file is involved, which file."""

    def __init__(self, problem: str, path: str | os.PathLike | None = None):
        self.problem = problem
        self.path = None if path is None else os.fspath(path)
        super().__init__(f"{self.path}: {problem}" if self.path else problem)
