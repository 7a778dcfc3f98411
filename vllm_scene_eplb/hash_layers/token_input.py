"""The tokens an operator has, read from files: token ids per request (JSON or JSONL lists), a token
histogram (a JSON list, index = token id), or text prompts (JSON or JSONL strings, or ``{"prompt":
...}`` lines as ``vllm bench serve``'s custom dataset holds them) tokenized by the model's own
tokenizer. Each read is validated; ``hash_routing`` checks the ids against the vocabulary."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import SceneEplbError
from ..formats.base import JSON_BYTES_IN_MEMORY, check_fits_memory


def _documents(path: str | os.PathLike) -> list[Any]:
    """A ``.jsonl`` file's lines (blank lines skipped) or a JSON file's list, parsed."""
    path = Path(path)
    try:
        check_fits_memory(path.stat().st_size * JSON_BYTES_IN_MEMORY, "decoding this JSON file", path)
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SceneEplbError(f"cannot read file: {getattr(exc, 'strerror', None) or exc}", path) from None
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()] if path.suffix == ".jsonl" else [(0, text)]
    docs = []
    for number, line in lines:
        try:
            docs.append(json.loads(line))
        except (ValueError, RecursionError) as exc:
            where = f"line {number}" if number else "the file"
            raise SceneEplbError(f"{where} is not valid JSON: {exc}", path) from None
    if path.suffix == ".jsonl":
        return docs
    if not isinstance(docs[0], list):
        raise SceneEplbError("expected a JSON list (one item per request), or a .jsonl file with one per line", path)
    return docs[0]


def read_token_ids(path: str | os.PathLike) -> list[list]:
    """Token ids per request: a JSON list of lists of integers, or a .jsonl file of one list a line."""
    requests = _documents(path)
    for i, ids in enumerate(requests):
        if not isinstance(ids, list):
            raise SceneEplbError(f"request {i} is {type(ids).__name__}, not a list of token ids", path)
    return requests


def read_histogram(path: str | os.PathLike) -> list:
    """A token histogram: a JSON list of counts, the count of token id i at index i."""
    return _documents(path)


def read_prompts(path: str | os.PathLike) -> list[str]:
    """Text prompts: a JSON list or .jsonl lines of strings, or of objects with a string ``prompt``."""
    prompts = []
    for i, item in enumerate(_documents(path)):
        text = item.get("prompt") if isinstance(item, dict) else item
        if not isinstance(text, str):
            raise SceneEplbError(
                f"prompt {i} is {type(text).__name__}, expected a string or an object with a string prompt", path
            )
        prompts.append(text)
    return prompts


def tokenize(prompts: list[str], model_dir: str | os.PathLike) -> list[list[int]]:
    """Each prompt's token ids as the server computes them from a completion prompt: the model's own
    tokenizer (``transformers``), special tokens (BOS) added."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise SceneEplbError(
            "tokenizing --prompts needs the transformers package (pip install transformers); or give token ids (--token-ids)"
        ) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(os.fspath(model_dir))
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a missing or foreign tokenizer
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise SceneEplbError(f"cannot load the model's tokenizer: {type(exc).__name__}: {first}", model_dir) from None
    return [list(tokenizer(text, add_special_tokens=True)["input_ids"]) for text in prompts]
