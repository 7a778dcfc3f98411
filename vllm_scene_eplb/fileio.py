"""Atomic writes and checksums shared by every file format the project writes."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .errors import SceneEplbError


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no whitespace) used for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def doc_checksum(doc: dict) -> str:
    """Checksum of a JSON document over every key but ``checksum`` itself."""
    return sha256_hex(canonical_json({k: v for k, v in doc.items() if k != "checksum"}))


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> Path:
    """Write a file through ``write(fh)`` into a temporary sibling, fsync, then rename over ``path``.

    Readers never see a half-written file, and a failure leaves no file behind (an existing ``path``
    is untouched). The file's mode is what ``open`` would give under the umask (0644 under 022). A failure of the file system (full disk, read-only, a path under a file) is a
    SceneEplbError naming ``path`` and the reason.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_file(path.parent, path.name, write)
        try:
            os.replace(tmp, path)
        except OSError:
            _discard(tmp)
            raise
    except OSError as exc:
        raise SceneEplbError(f"cannot write: {exc.strerror or exc}", path) from None
    return path


def atomic_write_files(folder: str | os.PathLike, files: dict[str, bytes]) -> dict[str, Path]:
    """Write several files into ``folder`` all or nothing: every one goes to a temporary sibling
    first (fsynced); only when all are down are they renamed into place, so a full disk or any
    other failure leaves the folder as it was."""
    folder = Path(folder)
    temps: dict[str, str] = {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            temps[name] = _temp_file(folder, name, functools.partial(_write_bytes, data=data))
        for name, tmp in temps.items():
            os.replace(tmp, folder / name)
    except OSError as exc:
        for tmp in temps.values():
            _discard(tmp)
        raise SceneEplbError(f"cannot write: {exc.strerror or exc}", folder) from None
    return {name: folder / name for name in files}


def _temp_file(folder: Path, name: str, write: Callable[[IO[bytes]], object]) -> str:
    """A temporary sibling of ``folder / name`` written through ``write(fh)`` and fsynced; on any
    failure it is removed and the error raised."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; a server of another user must read it
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        _discard(tmp)
        raise
    return tmp


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (``/proc/self/status``):
    setting and restoring it would race with files other threads create meanwhile."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def load_json(path: str | os.PathLike, what: str) -> Any:
    """A JSON file's document, or one SceneEplbError naming ``what`` and the file (unreadable, not
    UTF-8, not JSON, integers too long to parse, nesting past the parser)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SceneEplbError(f"cannot read {what}: {exc}", path) from None


def _write_bytes(fh: IO[bytes], data: bytes) -> None:
    fh.write(data)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Atomically write ``data`` to ``path``."""
    return atomic_write(path, functools.partial(_write_bytes, data=data))
