"""Install the DeepSeek-V4 stand-ins (``tests/v4_standin``, on this process's path) as a server's worker
does, and print what was installed and which V4 CPU ops are defined afterwards, as one JSON object
(tests/engine/test_v4_stand_ins.py)."""

from __future__ import annotations

import json

import torch
import v4_stand_ins
from v4_cpu_ops import SCHEMAS

installed = v4_stand_ins.install()
ops = [v4_stand_ins.op_name(schema) for schema, _ in SCHEMAS]
print(
    json.dumps(
        {
            "cpu_ops": [op for op in installed if op in ops],
            "installed": installed,
            "defined_after": [op for op in ops if hasattr(torch.ops._C, op)],
        }
    )
)
