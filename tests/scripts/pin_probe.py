"""``local_server.pin_host`` on the given bindings, then where this process and a process it starts
run (tests/unit/test_pin_host.py). With ``--where`` only: print this process's cores.

Arguments: ``VLLM_CPU_OMP_THREADS_BIND`` values. Prints one JSON object: ``host`` (what pin_host
returned), ``self`` and ``child`` (sorted core lists)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main() -> None:
    if sys.argv[1:] == ["--where"]:
        print(json.dumps(sorted(os.sched_getaffinity(0))))
        return
    from vllm_scene_eplb.rig.local_server import pin_host

    host = pin_host(*sys.argv[1:])
    child = subprocess.run([sys.executable, __file__, "--where"], capture_output=True, text=True, check=True)
    print(json.dumps({"host": sorted(host), "self": sorted(os.sched_getaffinity(0)), "child": json.loads(child.stdout)}))


if __name__ == "__main__":
    main()
