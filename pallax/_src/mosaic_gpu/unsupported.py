"""Spec 003 names pallax does not run yet: each says what it is, why, and what works instead."""
from __future__ import annotations


def _unsupported(name: str, why: str, instead: str):
  def fn(*args, **kwargs):
    raise NotImplementedError(f"plgpu.{name}: {why} are not supported by pallax yet; {instead}")
  fn.__name__ = name
  fn.__doc__ = f"Not supported yet: {why}."
  return fn


_BLACKWELL = ("Blackwell (sm_100) tensor-memory and tcgen05 operations",
              "on Hopper use plgpu.wgmma with a plgpu.ACC accumulator")
_CLUSTER = ("cluster-wide operations (clusters of more than one block)",
            "use cluster=(1,) and per-block copies")
_MULTIMEM = ("multimem (NVLink multicast) operations", "use shard_map with collectives around the kernel")

tcgen05_mma = _unsupported("tcgen05_mma", *_BLACKWELL)
tcgen05_commit_arrive = _unsupported("tcgen05_commit_arrive", *_BLACKWELL)
async_load_tmem = _unsupported("async_load_tmem", *_BLACKWELL)
async_store_tmem = _unsupported("async_store_tmem", *_BLACKWELL)
wait_load_tmem = _unsupported("wait_load_tmem", *_BLACKWELL)
commit_tmem = _unsupported("commit_tmem", *_BLACKWELL)
async_copy_smem_to_tmem = _unsupported("async_copy_smem_to_tmem", *_BLACKWELL)
async_copy_scales_to_tmem = _unsupported("async_copy_scales_to_tmem", *_BLACKWELL)
async_copy_sparse_metadata_to_tmem = _unsupported("async_copy_sparse_metadata_to_tmem", *_BLACKWELL)
format_tcgen05_sparse_metadata = _unsupported("format_tcgen05_sparse_metadata", *_BLACKWELL)
try_cluster_cancel = _unsupported("try_cluster_cancel", "cluster launch control (Blackwell)",
                                  "use a grid of blocks, or plgpu.nd_loop over a persistent grid")
query_cluster_cancel = _unsupported("query_cluster_cancel", "cluster launch control (Blackwell)",
                                    "use a grid of blocks, or plgpu.nd_loop over a persistent grid")
dynamic_scheduling_loop = _unsupported("dynamic_scheduling_loop", "dynamic work scheduling loops",
                                       "use plgpu.nd_loop (a static schedule)")
multimem_store = _unsupported("multimem_store", *_MULTIMEM)
multimem_load_reduce = _unsupported("multimem_load_reduce", *_MULTIMEM)
semaphore_signal_multicast = _unsupported("semaphore_signal_multicast", *_MULTIMEM)
multicast_ref = _unsupported("multicast_ref", *_CLUSTER)
cluster_ref = _unsupported("cluster_ref", *_CLUSTER)
warp_map = _unsupported("warp_map", "per-warp code inside a warpgroup (plgpu.WarpMesh)",
                        "write the warpgroup's code with plgpu.kernel(num_threads=...) threads")
inline_mgpu = _unsupported("inline_mgpu", "inline Mosaic GPU IR", "write the operation in JAX")
async_store_smem = _unsupported("async_store_smem", "asynchronous register-to-SMEM stores",
                                "store with ref[...] = value, then plgpu.commit_smem()")
griddepcontrol_wait = _unsupported("griddepcontrol_wait", "programmatic dependent launch",
                                   "let XLA order the kernels")
griddepcontrol_launch_dependents = _unsupported("griddepcontrol_launch_dependents",
                                                "programmatic dependent launch", "let XLA order the kernels")
mma = _unsupported("mma", "register-level mma.sync products", "use plgpu.wgmma on Hopper")

