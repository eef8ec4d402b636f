"""Shared setup of the SGLang conformance tests: the two tree caches compared."""

import os
import sys
import warnings

# SGLang warns at import about GPU-only quantization kernels; the tests run on the CPU.
warnings.filterwarnings("ignore", message="Only CUDA")
sys.path.insert(0, os.path.dirname(__file__))
# The servers' helpers, shared with the vLLM tests.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sglang.srt.mem_cache.radix_cache import RadixCache as SglangRadixCache  # noqa: E402

from mla_cache.sglang import RadixCache as MlaRadixCache  # noqa: E402

BACKENDS = {"sglang": SglangRadixCache, "mla_cache": MlaRadixCache}
"""SGLang's own radix cache (the reference) and mla_cache's backend."""
