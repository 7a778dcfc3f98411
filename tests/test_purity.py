import subprocess
import sys


def test_core_imports_no_engine_and_no_torch():
    code = (
        "import sys\n"
        "import vllm_scene_eplb.cli, vllm_scene_eplb.fit, vllm_scene_eplb.formats, vllm_scene_eplb.report, vllm_scene_eplb.config\n"
        "bad = [m for m in ('torch', 'vllm', 'vllm_ascend') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
