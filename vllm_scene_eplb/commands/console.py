"""Where a command speaks: the ``Console`` every command is handed (``--json``, ``-q``), and the strict
JSON it prints (``json_safe``)."""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from ..terminal import printable


@dataclass(frozen=True)
class Console:
    """Where a command speaks: the result on stdout (JSON with ``--json``), progress on stderr
    unless ``quiet``. Passed to every command, so nothing reads a module-level switch."""

    quiet: bool = False
    json: bool = False

    @contextmanager
    def progress(self, what: str):
        """Say on stderr what is running and how long it took (stdout stays clean for --json)."""
        start = time.perf_counter()
        self.say(f"scene-eplb: {what}...")
        yield
        self.say(f"scene-eplb: {what}: done in {time.perf_counter() - start:.2f}s")

    def say(self, message: str) -> None:
        if not self.quiet:
            print(printable(message, lines=True), file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        """A default the command took on the user's behalf, on stderr even with ``-q`` (it changes
        the result, and stdout stays clean for --json)."""
        print(printable(message, lines=True), file=sys.stderr, flush=True)

    def emit(self, payload: dict, text: str) -> None:
        """The result: ``payload`` as strict JSON with ``--json`` (see ``json_safe``), else ``text``
        with every control character escaped (a server's strings never act on the terminal)."""
        print(json.dumps(json_safe(payload), indent=2) if self.json else printable(text, lines=True))


NON_FINITE_KEY = "non_finite"


def json_safe(payload: dict) -> dict:
    """``payload`` with every NaN or infinite number made null, the note ``NON_FINITE_KEY`` listing
    where (JSON has no NaN: ``--json`` output stays JSON a strict parser reads)."""
    where: list[str] = []

    def clean(value, at: str):
        if isinstance(value, float) and not math.isfinite(value):
            where.append(f"{at}: {value}")
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{at}.{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{at}[{i}]") for i, v in enumerate(value)]
        return value

    out = clean(payload, "$")
    return {**out, NON_FINITE_KEY: where} if where and isinstance(out, dict) else out
