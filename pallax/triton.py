"""The Triton path's public API (mirrors the Triton module of JAX Pallas).

``import pallax.triton as plgpu``.
"""
from pallax._src.triton.api import (
    CompilerParams, KernelArtifact, approx_tanh, atomic_add, atomic_and, atomic_cas, atomic_max,
    atomic_min, atomic_or, atomic_xchg, atomic_xor, debug_barrier, dot, elementwise_inline_asm,
    load, lower, max_contiguous, store)
