"""The field readers every wire object is read with: a check per field, and a failure that names the
object, the field and what it held in one line."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, NoReturn

from ..errors import SceneEplbError

# What crosses between the workers, the API server and the clients, as typed objects: a reader
# takes an answer only through ``from_wire``, which checks every field's type, shape, finiteness
# and range and names the field at fault in one line (a server that is not this plugin, or a broken
# one, never crashes a command; a broken worker answer is a 500, never a crash of the route);
# ``to_wire`` gives the object back, key for key what crosses. Worker answers cross vLLM's
# collective_rpc as ``to_wire``'s plain dicts: the engine core hands a utility call's result to the
# API server as msgpack without type information (vLLM's ``v1/serial_utils.py``), where a dataclass
# would arrive as a map of its own fields, not the wire's keys (``tests/unit/test_worker_answers.py``).
# The routes' answers cross as JSON.

MAX_WIRE_INT = 2**53  # every integer of an answer (a count, a total, a rank) is exact in float64
_REQUIRED: Any = object()  # ``_Fields.get``'s default: the key must be there


def _show(value: Any) -> str:
    """A short description of a bad value for a message (never the whole of a large one)."""
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _is_int(v: Any, low: int = 0, high: int = MAX_WIRE_INT) -> bool:
    return type(v) is int and low <= v <= high


def _is_number(v: Any, low: float = -math.inf, high: float = math.inf) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and low <= v <= high


def _non_negative(v: Any) -> bool:
    return _is_number(v, 0)


def _floats(rows) -> tuple[tuple[float, ...], ...]:
    """[rows][cols] numbers as floats."""
    return tuple(tuple(map(float, row)) for row in rows)


class _Fields:
    """One wire object's fields, read with a check each; a failure names the object (``what``, after
    ``prefix``), the field and what it held, with ``source`` (the URL or file) as its place. The one
    reader of every answer and of the timing window."""

    def __init__(self, doc: Any, what: str, source: str | None, prefix: str = "the server's "):
        self.what, self.source, self.prefix = what, source, prefix
        if not isinstance(doc, dict):
            self.fail(f"must be a JSON object, got {_show(doc)}")
        self.doc = doc

    def fail(self, problem: str) -> NoReturn:
        raise SceneEplbError(f"{self.prefix}{self.what} {problem}", self.source)

    def get(self, key: str, ok, expected: str, nullable: bool = False, default: Any = _REQUIRED) -> Any:
        """``key``'s value when ``ok`` (or None when ``nullable``); ``default`` where the key may be absent."""
        if key not in self.doc:
            if default is not _REQUIRED:
                return default
            self.fail(f"has no {key!r} (not this plugin's answer, or a plugin older than this client?)")
        value = self.doc[key]
        if (value is None and nullable) or ok(value):
            return value
        self.fail(f"{key} must be {expected}{' or null' if nullable else ''}, got {_show(value)}")

    def integer(self, key: str, low: int = 0, nullable: bool = False) -> int:
        return self.get(key, lambda v: _is_int(v, low), f"an integer >= {low}", nullable)

    def number(self, key: str, low: float = -math.inf, high: float = math.inf, nullable: bool = False) -> float:
        return self.get(key, lambda v: _is_number(v, low, high), f"a finite number in [{low:g}, {high:g}]", nullable)

    def text(self, key: str, nullable: bool = False, choices: tuple[str, ...] | None = None) -> str:
        expected = f"one of {', '.join(choices)}" if choices else "a string"
        return self.get(key, lambda v: isinstance(v, str) and (choices is None or v in choices), expected, nullable)

    def flag(self, key: str) -> bool:
        return self.get(key, lambda v: type(v) is bool, "true or false")

    def _list(self, key: str, ok, expected: str, nullable: bool, length: int | None) -> tuple | None:
        """A list of values each ``ok`` (of ``length`` when given); a bad value is named by its index."""
        sized = "" if length is None else f"{length} "
        value = self.get(
            key, lambda v: isinstance(v, list) and length in (None, len(v)), f"a list of {sized}{expected}", nullable
        )
        if value is None:
            return None
        for i, v in enumerate(value):
            if not ok(v):
                self.fail(f"{key}[{i}] is {_show(v)}: {key} must be a list of {expected}")
        return tuple(value)

    def integers(self, key: str, length: int | None = None) -> tuple[int, ...]:
        return self._list(key, _is_int, "integers >= 0", False, length) or ()

    def integers_or_null(self, key: str, length: int | None = None) -> tuple[int, ...] | None:
        return self._list(key, _is_int, "integers >= 0", True, length)

    def numbers(self, key: str, low: float = -math.inf) -> tuple[float, ...]:
        expected = "finite numbers" if low == -math.inf else f"finite numbers >= {low:g}"
        return self._list(key, lambda v: _is_number(v, low), expected, False, None) or ()

    def numbers_or_null(self, key: str) -> tuple[float, ...] | None:
        return self._list(key, _is_number, "finite numbers", True, None)

    def obj(self, key: str, what: str, default: Any = _REQUIRED) -> _Fields | None:
        """A nested object (or null), read the same way."""
        value = self.get(key, lambda v: isinstance(v, dict), "an object", True, default)
        return None if value is None or value is default else _Fields(value, f"{self.what} {what}", self.source, self.prefix)

    def matrix(self, key: str, ok, expected: str, rows: int | None = None, nullable: bool = False) -> tuple[tuple, ...] | None:
        """[rows, W] values each ``ok``: a non-empty list of non-empty lists of one length (``rows``
        of them when given); a bad row or value is named by its place."""
        sized = "[ranks][layers]" if rows is None else f"[{rows}][...]"
        value = self.get(
            key,
            lambda v: isinstance(v, list) and (bool(v) or rows == 0) and rows in (None, len(v)),
            f"a non-empty {sized} list of lists",
            nullable,
        )
        if not value:
            return None if value is None else ()
        width = len(value[0]) if isinstance(value[0], list) else 0
        for r, row in enumerate(value):
            if not isinstance(row, list) or not row or len(row) != width:
                self.fail(f"{key} row {r} must be {width or 'some'} values like row 0, got {_show(row)}: ragged or not a list")
            for i, v in enumerate(row):
                if not ok(v):
                    self.fail(f"{key} row {r}: {key}[{r}][{i}] must be {expected}, got {_show(v)}")
        return tuple(map(tuple, value))

    def count_matrix(self, key: str, rows: int, nullable: bool = False) -> tuple[tuple[int, ...], ...] | None:
        """[rows, E] counts: non-negative integers, rectangular, summing to at most MAX_WIRE_INT."""
        value = self.matrix(key, _is_int, "an integer >= 0", rows, nullable)
        if value is not None and sum(map(sum, value)) > MAX_WIRE_INT:
            self.fail(f"{key} sums above 2**53: not counts")
        return value


def _wire(obj) -> dict:
    """A dataclass answer as its JSON object: its fields, tuples as lists, nested answers as theirs."""

    def plain(v):
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v.to_wire() if hasattr(v, "to_wire") else v

    return {f.name: plain(getattr(obj, f.name)) for f in fields(obj)}
