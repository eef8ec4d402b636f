"""Lets vLLM 0.34's CPU platform configure an engine on an x86 CPU without
Triton's CPU backend, for tests of the scheduler side.

vLLM 0.34's ``CpuPlatform.check_and_update_config`` raises "vLLM on x86 CPUs
requires Triton (triton-cpu)" when ``vllm.triton_utils.HAS_TRITON`` is false:
its x86 model runner compiles Triton kernels. These tests build the
scheduler side only (configs, the scheduler, its KV cache manager and
connectors), which runs no kernel. So while that one method runs,
``HAS_TRITON`` reads true; the method runs in full, and ``HAS_TRITON`` is
read nowhere else in it on x86, so every setting the scheduler sees is the
platform's own. vLLM 0.33's method only logs a warning there: this
silences it.
"""

from __future__ import annotations

import vllm.triton_utils as triton_utils
from vllm.platforms.cpu import CpuPlatform

_check = CpuPlatform.check_and_update_config.__func__


def _check_without_triton(cls, vllm_config):
    had = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        return _check(cls, vllm_config)
    finally:
        triton_utils.HAS_TRITON = had


CpuPlatform.check_and_update_config = classmethod(_check_without_triton)
