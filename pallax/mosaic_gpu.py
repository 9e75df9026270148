"""The Mosaic GPU programming model (spec 003): ``import pallax.mosaic_gpu as plgpu`` in place of
JAX's Mosaic GPU module (the ``plgpu`` of JAX Pallas).

Kernels written with it run in pallax's interpreter on any machine, with checks of the rules the
hardware leaves to the user (barrier phases, commits, in-flight copies, deadlocks). On Hopper GPUs
one-warpgroup kernels compile to Gluon (a first subset: see the README).
"""
from pallax._src.gluon import backend as _backend  # noqa: F401 (registers the Gluon backend)
from pallax._src.mosaic_gpu import semantics as _semantics  # noqa: F401 (registers the rules)
from pallax._src.mosaic_gpu import clusters as _clusters  # noqa: F401 (registers the rules)
from pallax._src.mosaic_gpu import sync as _sync  # noqa: F401 (registers the rules)
from pallax._src.mosaic_gpu import warp_semantics as _warp_semantics  # noqa: F401 (registers the rules)
from pallax._src.mosaic_gpu import tcgen05_mma_rules as _tcgen05  # noqa: F401 (registers the rules)
from pallax._src.mosaic_gpu import layout_checks as _layout_checks  # noqa: F401 (registers the checks)
from pallax._src.mosaic_gpu import profile_record as _profile_record  # noqa: F401 (registers the hook)
from pallax._src.mosaic_gpu.cross_device import SemaphoreSignal, semaphore_signal_parallel
from pallax._src.remote import remote_ref
from pallax._src.jax_internals import Transform
from pallax._src.mosaic_gpu.core import (
    ACC, GMEM, REGS, SMEM, TMEM, Barrier, BlockSpec, ClusterBarrier, CompilerParams, CopyPartition,
    GPUMemoryRef, Layout, LoweringSemantics, MemorySpace, Mesh, OOBFillMode, ParameterizedLayout,
    RefType, RefUnion, Replicated, SemaphoreType, SomeLayout, SwizzleTransform, Tiling,
    TilingTransform, TMEMLayout, TraceScope, TransposeTransform, TryClusterCancelResult,
    WGMMAAccumulatorRef)
from pallax._src.mosaic_gpu.core import shape_dtype_struct as ShapeDtypeStruct  # noqa: N812
from pallax._src.gluon.compile import lower
from pallax._src.mosaic_gpu.helpers import NDLoopInfo, find_swizzle, nd_loop, planar_snake
from pallax._src.mosaic_gpu.kernel import kernel
from pallax._src.mosaic_gpu.mma import mma
from pallax._src.mosaic_gpu.warps import WarpMesh, warp_map
from pallax._src.mosaic_gpu.primitives import (
    async_prefetch, atomic_add, atomic_and, atomic_max, atomic_min, atomic_or, atomic_xor,
    barrier_arrive, barrier_test, barrier_wait, broadcasted_iota, commit_smem,
    commit_smem_to_gmem_group, copy_gmem_to_smem, copy_smem_to_gmem, layout_cast, load,
    print_layout, semaphore_signal, semaphore_wait, set_max_registers, transpose_ref,
    wait_gmem_to_smem, wait_smem_to_gmem, wgmma, wgmma_accumulator_load, wgmma_wait)
from pallax._src.mosaic_gpu.peer_smem import async_store_smem, cluster_ref
from pallax._src.mosaic_gpu.unsupported import (
    griddepcontrol_launch_dependents, griddepcontrol_wait,
    inline_mgpu, multicast_ref, multimem_load_reduce, multimem_store, semaphore_signal_multicast)
from pallax._src.mosaic_gpu.launch_control import query_cluster_cancel, try_cluster_cancel
from pallax._src.mosaic_gpu.scheduling import dynamic_scheduling_loop
from pallax._src.mosaic_gpu.tcgen05_sparse import format_tcgen05_sparse_metadata
from pallax._src.mosaic_gpu.tcgen05 import (
    async_copy_scales_to_tmem, async_copy_smem_to_tmem, async_copy_sparse_metadata_to_tmem, async_load_tmem, async_store_tmem,
    commit_tmem, tcgen05_commit_arrive, tcgen05_mma, wait_load_tmem)

GPUMemorySpace = MemorySpace   # the docs' older name
from pallax._src.mosaic_gpu.pipeline import emit_pipeline, emit_pipeline_warp_specialized  # noqa: E402
from pallax._src.mosaic_gpu.pipeline_state import PipelinePipeline  # noqa: E402
from pallax._src.torch.kernel import as_torch_kernel  # noqa: E402,F401  (plgpu kernels from torch: Gluon on a GPU, the interpreter for CPU tensors)
