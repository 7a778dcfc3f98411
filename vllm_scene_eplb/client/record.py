"""HTTP client for a server's recorder routes (stdlib only): start, stop, dump, status, native_load.
Each answer is read through its typed reader in ``protocol`` (``answer``), never as a bare dict."""

from __future__ import annotations

from typing import Any

from ..errors import SceneEplbError
from ..protocol import ACTIONS, KEEP_SKIPPED, ROUTE_BY_ACTION, DumpAnswer, NativeLoadAnswer, StatusAnswer
from .http import ServerError, request_json

# the typed answer of each route (start and stop answer the status)
ANSWERS = {"dump": DumpAnswer, "native_load": NativeLoadAnswer}


def call(url: str, action: str, api_key: str | None = None, timeout: float = 300.0, keep_skipped: bool = False) -> Any:
    """Send ``action`` to the server at ``url``; returns its JSON answer, raises SceneEplbError on any error.
    ``keep_skipped`` (dump only): write a record with skipped passes anyway."""
    if action not in ROUTE_BY_ACTION:
        raise SceneEplbError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    if not url.startswith(("http://", "https://")):
        raise SceneEplbError(f"--url {url!r}: expected a server base URL such as http://host:8000")
    route = ROUTE_BY_ACTION[action]
    target = url.rstrip("/") + route.path + (f"?{KEEP_SKIPPED}=true" if keep_skipped else "")
    try:
        return request_json(target, route.method, api_key, timeout, action)
    except ServerError as exc:
        if exc.status == 404 and "not enabled" not in exc.problem:
            raise ServerError(f"{exc.problem} (is the server started with VLLM_PLUGINS=scene_eplb?)", target, 404) from None
        raise


def answer(url: str, action: str, api_key: str | None = None, timeout: float = 300.0, keep_skipped: bool = False):
    """``action``'s answer, checked and typed: ``StatusAnswer`` (status, start, stop), ``DumpAnswer`` or
    ``NativeLoadAnswer``; an answer of the wrong shape is a SceneEplbError naming the field and the URL."""
    doc = call(url, action, api_key, timeout, keep_skipped)
    reader: Any = ANSWERS.get(action, StatusAnswer)
    return reader.from_wire(doc, url.rstrip("/") + ROUTE_BY_ACTION[action].path)
