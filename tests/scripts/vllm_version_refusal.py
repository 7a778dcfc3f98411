"""The vLLM adapter under a faked vLLM 0.23 (tests/engine/test_vllm_version.py): plugin off starts, the given additional config is refused or starts.

Argument: the additional config (JSON). Prints REFUSED: <message> or STARTED."""

from __future__ import annotations

import json
import sys

import vllm_scene_eplb.adapters.entry as entry


def main() -> None:
    cfg = json.loads(sys.argv[1])
    entry.vllm_version = lambda: "0.23.0"
    entry.ascend_version = lambda: None
    entry.register()
    from vllm.config import VllmConfig

    VllmConfig(additional_config={})  # plugin off: fine
    try:
        VllmConfig(additional_config=cfg)
    except Exception as exc:
        print("REFUSED:", exc)
    else:
        print("STARTED")


if __name__ == "__main__":
    main()
