"""The vLLM-Ascend release this adapter was written against, and the check that refuses any other.

Releases are compared by their release and post parts, not as strings: an image built from source
reports ``0.23.0.post1+g<hash>`` (a local part) or a ``.devN`` build of the same post release, and
is the same code as far as this adapter is concerned; the local part is logged.
"""

from __future__ import annotations

import logging

from ...errors import SceneEplbError

# vLLM exactly 0.23.0: vLLM-Ascend 0.23.0.post1 selects its fused MoE class (AscendFusedMoE, the
# class the recorder hooks) only when vllm_version_is("0.23.0"); a 0.23.1 would get another class.
SUPPORTED = {"vllm-ascend": "0.23.0.post1", "vllm": "0.23.0"}
logger = logging.getLogger("vllm.scene_eplb")


def _release(text: str):
    """(release, post, local) of a version string, or None when it does not parse."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(text)
    except InvalidVersion:
        return None
    return v.release, v.post, v.local


def check_versions(ascend_version: str, vllm_version: str) -> None:
    """Refuse engine versions this adapter was not written for (by release and post part, vLLM
    exactly 0.23.0; a local build tag or a dev build of the supported release is accepted, and its
    local part logged)."""
    ours, want = _release(ascend_version), _release(SUPPORTED["vllm-ascend"])
    vllm = _release(vllm_version)
    if ours is None or ours[:2] != want[:2] or vllm is None or vllm[:2] != _release(SUPPORTED["vllm"])[:2]:
        raise SceneEplbError(
            f"vllm_scene_eplb's Ascend adapter is written for vllm-ascend {SUPPORTED['vllm-ascend']} with "
            f"vLLM =={SUPPORTED['vllm']}, found vllm-ascend {ascend_version} with vLLM {vllm_version}"
        )
    if ours[2]:
        logger.info("scene-eplb: vllm-ascend %s is a local build (%s) of %s", ascend_version, ours[2], SUPPORTED["vllm-ascend"])
