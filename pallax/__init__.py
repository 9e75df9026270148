"""pallax: the Pallas kernel language as an independent package.

``import pallax as pl`` in place of ``from jax.experimental import pallas as pl``.
"""
from pallax._src.core import (
    ANY, Blocked, BlockSpec, CompilerParams, CostEstimate, Element, GridSpec, InterpretParams,
    MemoryRef, MemorySpace, Mesh, PrefetchScalarGridSpec, SemaphoreType, Squeezed,
    enable_debug_checks, no_block_spec, squeezed)
from pallax._src.core import debug_checks_enabled
from pallax._src.grid_mapping import BlockMapping, GridMapping
from pallax._src.pallas_call import pallas_call
from pallax._src.primitives import (
    Buffered, Slice, broadcast_to, cdiv, debug_check, debug_print, dot, ds, dslice, empty, empty_like,
    load, loop, max_contiguous, multiple_of, next_power_of_2, num_programs, program_id,
    run_scoped, run_state, store, swap, when)
from pallax._src.semaphores import (
    get_global, semaphore, semaphore_read, semaphore_signal, semaphore_wait)
from pallax._src.remote import DeviceIdType
from pallax._src.errors import KernelCheckError
from pallax._src.kernel import core_map, kernel
from pallax._src.torch.kernel import as_torch_kernel
from pallax._src.triton import params as _triton_backend  # registers the Triton backend

__version__ = "0.1.0"
