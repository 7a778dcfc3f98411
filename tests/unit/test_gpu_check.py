"""``scripts/gpu_check.sh`` on a machine without a CUDA GPU: it says so in one FAIL line and exits
non-zero (2), checking nothing (the checks themselves need a GPU: see the script)."""

import os
import subprocess
import sys

from ..conftest import REPO


def test_gpu_check_without_a_gpu_fails_cleanly():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 2, res.stdout + res.stderr[-2000:]
    assert res.stdout.strip().splitlines() == [
        "FAIL gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): nothing was checked"
    ]
