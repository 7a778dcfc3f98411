"""What every option and output path must be, checked before a command reads or computes anything.

Argument types (``integer``, ``number``) give argparse a range and finiteness check, so a bad option
fails at parse time with one line. ``check_output_file`` and ``check_output_dir`` refuse an output path that cannot be written
(a directory, a missing parent, a read-only place, an input file, a place inside the ``--model``
folder) before any work starts; the write itself is atomic, so an existing output survives every
later failure byte for byte.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import SceneEplbError
from ..planning.model_files import model_folder

MAX_OPTION_INT = 1 << 20  # any count an option takes (ranks, slots, groups, runs) stays far below this


def integer(low: int, high: int = MAX_OPTION_INT) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (every refusal names the range)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in [{low}, {high}], got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def number(
    low: float, high: float = math.inf, low_open: bool = False, high_open: bool = False, allow_inf: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite number in the range (``allow_inf``: +inf too, e.g. a request rate);
    every refusal names the range (an unbounded end closed only where inf is taken)."""
    hi = ")" if high_open or (math.isinf(high) and not allow_inf) else "]"
    span = f"{'(' if low_open else '['}{low:g}, {high:g}{hi}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {span}, got {text!r}") from None
        if math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)):
            raise argparse.ArgumentTypeError(f"must be {'a' if allow_inf else 'a finite'} number in {span}, got {text!r}")
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if (too_low or too_high) and not (allow_inf and math.isinf(value)):
            raise argparse.ArgumentTypeError(f"must be in {span}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _check_inputs(out: Path, inputs: Iterable[str | os.PathLike], model: str | os.PathLike | None) -> None:
    """Refuse an output that is one of the ``inputs`` or lies inside the ``--model`` folder ``model``
    (the checkpoint's own files), naming which."""
    for src in inputs:
        if _same_file(out, Path(src)):
            raise SceneEplbError(f"output would replace an input file ({src}); choose another path", out)
    if model is not None:
        folder = model_folder(model).resolve()
        if out.resolve() == folder or folder in out.resolve().parents:
            raise SceneEplbError(
                f"output lies inside the --model folder {model_folder(model)} and could replace the model's own "
                "files; choose a path outside it",
                out,
            )


def check_output_file(path: str, inputs: Iterable[str | os.PathLike] = (), model: str | os.PathLike | None = None) -> Path:
    """``path`` as a file a command may (atomically) replace, or the one-line reason it may not (an
    input file, or a path inside the ``--model`` folder, included)."""
    if not path:
        raise SceneEplbError("output path is empty")
    out = Path(path)
    if out.is_dir():
        raise SceneEplbError("output is a directory, expected a file path", out)
    parent = out.parent
    if not parent.exists():
        raise SceneEplbError(f"output folder {parent} does not exist", out)
    if not parent.is_dir():
        raise SceneEplbError(f"output folder {parent} is not a directory", out)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SceneEplbError(f"output folder {parent} is not writable", out)
    _check_inputs(out, inputs, model)
    return out


def check_output_dir(path: str, model: str | os.PathLike | None = None) -> Path:
    """``path`` as a folder a command may write files into (made when missing, its parent must
    exist), outside the ``--model`` folder."""
    if not path:
        raise SceneEplbError("output path is empty")
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise SceneEplbError("output exists and is not a directory", out)
    where = out if out.exists() else out.parent
    if not where.is_dir():
        raise SceneEplbError(f"output folder's parent {where} does not exist or is not a directory", out)
    if not os.access(where, os.W_OK | os.X_OK):
        raise SceneEplbError(f"{where} is not writable", out)
    _check_inputs(out, (), model)
    return out
