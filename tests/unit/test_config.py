import pytest

from vllm_scene_eplb.errors import SceneEplbError
from vllm_scene_eplb.runtime.config import PluginConfig, parse_config


def test_absent_means_off_and_defaults_are_sane():
    assert parse_config({}) is None and parse_config(None) is None
    cfg = parse_config({"scene_eplb": {}})
    assert cfg.role == "auto" and cfg.ring_entries == 512 and cfg.dispatch == "static" and cfg.layout is None


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"rol": "prefill"}, "unknown key(s) ['rol']"),
        ({"role": "p"}, "role must be one of"),
        ({"ring_entries": 0}, "ring_entries must be"),
        ({"ring_entries": "512"}, "ring_entries must be"),
        ({"buffer_slots": 64}, "'buffer_slots' is now called 'ring_entries'"),
        ({"dispatch": "random"}, "dispatch must be one of"),
        ({"export_timeout_s": 0}, "export_timeout_s must be"),
        ({"export_timeout_s": True}, "export_timeout_s must be"),
        ({"drift_windows": 1.5}, "drift_windows must be an integer"),
        ({"drift_margin": -1}, "drift_margin must be a number"),
        ({"live_per_layer_metrics": "yes"}, "live_per_layer_metrics must be true or false"),
        ({"layout": "/nonexistent/layout.json"}, "no such file"),
        ({"dump_dir": ""}, "non-empty path"),
        ("on", "must be a JSON object"),
    ],
)
def test_bad_settings_fail_clearly(raw, message):
    with pytest.raises(SceneEplbError) as exc:
        parse_config({"scene_eplb": raw})
    assert message in str(exc.value)


def test_role_resolution():
    auto = PluginConfig()
    assert auto.resolve_role("kv_producer") == "prefill"
    assert auto.resolve_role("kv_consumer") == "decode"
    assert auto.resolve_role(None) == "prefill"
    with pytest.raises(SceneEplbError, match="kv_both"):
        auto.resolve_role("kv_both")
    assert PluginConfig(role="decode").resolve_role("kv_producer") == "decode"
