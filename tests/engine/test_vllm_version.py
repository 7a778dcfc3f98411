"""The vLLM adapter refuses other vLLM versions when its flag is set, and stays out of the way otherwise.

Only the reported version is faked (this machine has vLLM 0.32 only); the config class is vLLM's own.
"""

import pytest

from ..conftest import require_vllm, run_script

pytestmark = pytest.mark.engine


def _run(cfg: str) -> str:
    require_vllm()
    res = run_script("vllm_version_refusal", cfg)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_flag_on_another_vllm_stops_startup_with_the_version_message():
    out = _run('{"scene_eplb": {"role": "prefill"}}')
    assert "REFUSED:" in out and "written for vLLM 0.32.0 or 0.33.0, found vLLM 0.23.0" in out


def test_version_check_accepts_local_build_tags():
    from vllm_scene_eplb.adapters.vllm import version_supported

    assert version_supported("0.32.0") and version_supported("0.32.0+cpu")
    assert not version_supported("0.32.1") and not version_supported("0.23.0") and not version_supported("garbage")


def test_model_runner_v2_of_vllm_0_32_refuses_the_flag():
    """0.32's V2 has no EPLB suppress() (its warm-up would step as real). V2 cannot run on this machine
    (no Triton CPU backend), so its load_model is called on a stand-in
    object that carries only the config; the refusal happens before anything else is touched."""
    require_vllm()
    from types import SimpleNamespace

    from vllm_scene_eplb.adapters import vllm as adapter
    from vllm_scene_eplb.errors import SceneEplbError

    adapter.register()
    from vllm.v1.worker.cpu.model_runner import CPUModelRunner as CPUModelRunnerV2

    stand_in = SimpleNamespace(vllm_config=SimpleNamespace(additional_config={"scene_eplb": {}}))
    with pytest.raises(SceneEplbError, match="Model Runner V2 from vLLM 0.33 on"):
        CPUModelRunnerV2.load_model(stand_in)
