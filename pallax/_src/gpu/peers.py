"""Kernels that reach their peers' memory on GPUs: the addresses of every device's buffers,
exchanged at run time by XLA, around the kernel call (docs/distributed.md).

A kernel with remote references (``plgpu.remote_ref``, semaphore signals with ``device_id=``)
runs on each device of a ``jax.shard_map`` mesh as one XLA custom call, on XLA's buffers, whose
addresses change from call to call. So the call becomes three steps, all inside the program
``jax.jit`` compiles:

1. **The address kernel** (``addresses_p``, a few lines of PTX, one thread): takes the call's
   operands, allocates its outputs (operands it must write in place pass through it, aliased), and
   writes the address of every operand and output into a row of int64.
2. **XLA's all-gather** of that row over the mesh (NCCL): every device gets the table
   ``[device, buffer]`` of everyone's addresses. It also orders the devices: a device that holds
   the table knows that every peer's outputs exist and that the work its peers queued before the
   call (which may have used the same memory) is done.
3. **The kernel**, given the buffers of step 1 (aliased to its outputs: no copy, the addresses in
   the table are the ones it writes), the table, and its device's mesh coordinates; a remote
   reference reads its peer's address from the table. GPUs of one host address each other's
   memory once peer access is enabled (``enable_peer_access``); semaphores are atomics at system
   scope.

``Exchange`` tells the backend where the extra operands are. The Gluon backend reads it.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import remote
from pallax._src.gpu import launch as gpu_launch
from pallax._src.gpu.device import device_compute_capability


@dataclasses.dataclass(frozen=True)
class Exchange:
  """What a kernel call with remote references gets besides its operands: after the ``n_in``
  operands, one buffer per output in ``fresh`` (made by the address kernel, aliased to that
  output), then the address table (int64 ``[devices, n_in + n_out]``: column ``i`` the address
  of operand ``i``, column ``n_in + j`` that of output ``j``; rows in row-major order of
  ``axes``), then the device's mesh coordinates (int32, one per axis of ``axes``)."""
  axes: tuple[tuple[str, int], ...]
  n_in: int
  n_out: int
  fresh: tuple[int, ...]
  remote: bool = True    # False: the kernel only reads its mesh coordinates (no table)

  @property
  def columns(self) -> int:
    return self.n_in + self.n_out

  def aliases(self) -> dict:
    """Operand -> output aliases of the extra operands: each fresh buffer is its output."""
    return {self.n_in + k: j for k, j in enumerate(self.fresh)}


def needed(params) -> bool:
  """Whether a kernel call must be given peer addresses or mesh coordinates on a GPU."""
  return remote.uses_remote(params.jaxpr) or bool(remote.mesh_axes_read(params))


def exchange(params, axes: tuple) -> Exchange:
  """The exchange of a kernel call on a mesh of ``axes`` ((name, size), ...)."""
  n_out = len(params.out_avals)
  n_in = len(params.grid_mapping.block_mappings) - n_out
  if not remote.uses_remote(params.jaxpr):
    return Exchange(axes, n_in, n_out, (), remote=False)
  aliased = dict(params.input_output_aliases).values()
  return Exchange(axes, n_in, n_out, tuple(j for j in range(n_out) if j not in aliased))


def call(*args, params, bind):
  """The kernel call of ``params`` on ``args`` with the addresses of its peers' buffers
  (inside ``mlir.lower_fun``, under the mesh's axis names); ``bind(*operands, params=)`` binds
  the kernel with its ``Exchange``."""
  axes = tuple(ji.mesh_axis_sizes().items())
  ex = exchange(params, axes)
  n_in, n_out = ex.n_in, ex.n_out
  aliased = dict(params.input_output_aliases)
  coords = jnp.stack([lax.axis_index(a).astype(jnp.int32) for a, _ in axes]) if axes else \
      jnp.zeros((1,), jnp.int32)
  if not ex.remote:
    return bind(*args, coords, params=dataclasses.replace(params, peers=ex))
  fresh = ex.fresh
  passed = tuple(sorted(aliased))
  made = addresses_p.bind(*args, passed=passed, fresh=tuple(params.out_avals[j] for j in fresh),
                          out_of=tuple(aliased[i] for i in passed), n_out=n_out)
  through, buffers, row = made[:len(passed)], made[len(passed):-1], made[-1]
  table = lax.all_gather(row, tuple(a for a, _ in axes)) if axes else row[None]
  table = table.reshape(-1, n_in + n_out)
  operands = list(args)
  for i, v in zip(passed, through):
    operands[i] = v
  return bind(*operands, *buffers, table, coords, params=dataclasses.replace(params, peers=ex))


# --- the address kernel --------------------------------------------------------------------------

addresses_p = ji.Primitive("pallax_peer_addresses")
addresses_p.multiple_results = True


@addresses_p.def_abstract_eval
def _addresses_abstract(*avals, passed, fresh, out_of, n_out):
  del out_of
  return ([avals[i] for i in passed] + [ji.ShapedArray(a.shape, a.dtype) for a in fresh]
          + [ji.ShapedArray((len(avals) + n_out,), np.int64)])


def address_ptx(n_params: int, sources: list[int], table: int, cc: int) -> str:
  """A one-thread kernel of ``n_params`` pointer parameters that writes parameter
  ``sources[c]`` into element ``c`` of the int64 array at parameter ``table``."""
  params = ", ".join(f".param .u64 p{k}" for k in range(n_params))
  body = [f"  ld.param.u64 %t, [p{table}];", "  cvta.to.global.u64 %t, %t;"]
  for c, k in enumerate(sources):
    body += [f"  ld.param.u64 %a, [p{k}];", f"  st.global.u64 [%t+{8 * c}], %a;"]
  return "\n".join([
      ".version 8.0", f".target sm_{cc}{'a' if cc >= 90 else ''}", ".address_size 64", "",
      f".visible .entry pallax_peer_addresses({params})", "{", "  .reg .b64 %t, %a;",
      *body, "  ret;", "}", ""])


def _addresses_lowering(ctx, *args, passed, fresh, out_of, n_out):
  enable_peer_access()
  n_in, n_made = len(args), len(passed) + len(fresh)
  # Kernel parameters: the operands, the results (passed-through operands, fresh outputs, the
  # row), then the two scratch pointers XLA's PTX call passes every kernel.
  through = {i: n_in + r for r, i in enumerate(passed)}          # operand -> its result
  operand_param = [through.get(i, i) for i in range(n_in)]
  output_param = {j: n_in + r for r, j in enumerate(out_of)}      # an output aliased to an operand
  made = sorted(set(range(n_out)) - set(out_of))                 # the fresh outputs, in order
  output_param.update({j: n_in + len(passed) + r for r, j in enumerate(made)})
  sources = operand_param + [output_param[j] for j in range(n_out)]
  cc = device_compute_capability() or 90
  launch = gpu_launch.Launch("pallax_peer_addresses",
                             address_ptx(n_in + n_made + 3, sources, n_in + n_made, cc),
                             "", cc, 1, 0, 0, 1, (1, 1, 1))
  aliases = {i: r for r, i in enumerate(passed)}                 # operand -> result index
  return gpu_launch.xla_ptx_call(ctx, list(args), launch, aliases)


ji.mlir.register_lowering(addresses_p, _addresses_lowering, platform="cuda")


# --- peer access between the GPUs of this process ------------------------------------------------

@functools.cache
def enable_peer_access() -> None:
  """Lets every GPU of this process read and write every other's memory (``cuCtxEnablePeerAccess``
  between each pair of primary contexts, which XLA's allocations live in). Once per process."""
  gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
  if len(gpus) < 2:
    return
  cu = ctypes.CDLL("libcuda.so.1")
  ctxs = []
  for d in gpus:
    c = ctypes.c_void_p()
    _checked(cu, cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), d.local_hardware_id), "retain")
    ctxs.append(c)
  for a, ca in zip(gpus, ctxs):
    _checked(cu, cu.cuCtxPushCurrent_v2(ca), "push")
    try:
      for b, cb in zip(gpus, ctxs):
        if a is b:
          continue
        can = ctypes.c_int()
        cu.cuDeviceCanAccessPeer(ctypes.byref(can), a.local_hardware_id, b.local_hardware_id)
        if not can.value:
          raise RuntimeError(f"GPU {a.id} cannot access the memory of GPU {b.id} "
                             "(cuDeviceCanAccessPeer): remote references need peer access")
        r = cu.cuCtxEnablePeerAccess(cb, 0)
        if r not in (0, 704):   # 704: CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
          _checked(cu, r, "cuCtxEnablePeerAccess")
    finally:
      cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


def _checked(cu, r: int, what: str):
  if r != 0:
    name = ctypes.c_char_p()
    cu.cuGetErrorName(r, ctypes.byref(name))
    raise RuntimeError(f"{what} failed: CUDA error {r} ({(name.value or b'?').decode()})")
