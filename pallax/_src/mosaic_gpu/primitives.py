"""Spec 003's primitives: asynchronous copies, barriers, ``wgmma``, commits and waits, layout casts.

Each primitive takes its Refs as ``(ref, *transform leaves)`` with one pytree per Ref in the
``trees`` param (``None`` for an operand that is a value), like the Ref accesses of
``ref_access``. Their meaning lives in the interpreter (``interpret/eager.py``, rules registered by
``mosaic_gpu/semantics.py``); here are their types and effects only.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallax._src import backends
from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src import remote
from pallax._src import semaphores


class MosaicEffect(ji.effects.Effect):
  """Orders synchronization (commits, waits, arrivals) that touches no Ref operand."""

  def __repr__(self):
    return "MosaicGPU"


mosaic_effect = MosaicEffect()
ji.allow_effect_in_control_flow(MosaicEffect)


def view_shape(aval, transforms) -> tuple[int, ...]:
  """The shape of ``ref.at[...]``/``ref.transpose(...)`` views of a Ref of type ``aval``."""
  shape = tuple(aval.shape)
  for t in transforms:
    if isinstance(t, ji.NDIndexer):
      shape = tuple(t.get_indexer_shape())
    else:
      shape = tuple(t.transform_type(ji.ShapedArray(shape, aval.dtype)).shape)
  return shape


def flatten_refs(*refs):
  """(flat operands, trees) for Refs or views; ``None`` contributes nothing."""
  flat, trees = [], []
  for r in refs:
    if r is None:
      trees.append(None)
      continue
    base, transforms = prims.split_ref(r)
    leaves, tree = ji.tree_util.tree_flatten(transforms)
    flat += [base, *leaves]
    trees.append(tree)
  return flat, tuple(trees)


def split_refs(vals, trees):
  """Inverse of ``flatten_refs``: ([(ref, transforms) or None per tree], the operands after)."""
  vals, out = list(vals), []
  for tree in trees:
    if tree is None:
      out.append(None)
      continue
    ref, n = vals.pop(0), tree.num_leaves
    out.append((ref, tuple(ji.tree_util.tree_unflatten(tree, vals[:n]))))
    del vals[:n]
  return out, vals


def _positions(trees):
  pos, at = [], 0
  for tree in trees:
    pos.append(None if tree is None else at)
    at += 0 if tree is None else 1 + tree.num_leaves
  return pos


def _simple_indexer(t) -> bool:
  return (isinstance(t, ji.NDIndexer) and not t.int_indexer_shape
          and all(isinstance(i, ji.Slice) or jnp.ndim(i) == 0 for i in t.indices))


def _compose(outer, inner):
  """One NDIndexer for ``outer`` then ``inner`` (both of slices and scalars)."""
  inner_it, parts = iter(inner.indices), []
  for i in outer.indices:
    if not isinstance(i, ji.Slice):
      parts.append(i)
      continue
    j = next(inner_it)
    if isinstance(j, ji.Slice):
      parts.append(ji.Slice(i.start + j.start * i.stride, j.size, i.stride * j.stride))
    else:
      parts.append(i.start + j * i.stride)
  return ji.NDIndexer(tuple(parts), outer.shape, (), validate=False)


def barrier_view(ref):
  """A view of barriers with consecutive ``.at[...]`` views of slices and scalars merged into
  one, slices of one barrier made scalars (``bar.at[2:4].at[1:2]`` is ``bar.at[3]``): the same
  barriers, in the form the Gluon backend takes (one index)."""
  base, transforms = prims.split_ref(ref)
  out = []
  for t in transforms:
    if out and _simple_indexer(out[-1]) and _simple_indexer(t):
      out[-1] = _compose(out[-1], t)
    else:
      out.append(t)
  if out and _simple_indexer(out[-1]):
    last = out[-1]
    one = [i.start if isinstance(i, ji.Slice) and i.size == 1 else i for i in last.indices]
    out[-1] = ji.NDIndexer(tuple(one), last.shape, (), validate=False)
  if len(out) == len(transforms) and all(a is b for a, b in zip(out, transforms)):
    return ref
  return ji.TransformedRef(base, tuple(out))


def ref_effects(trees, reads=(), writes=()):
  pos = _positions(trees)
  effs = {mosaic_effect}
  effs |= {ji.ReadEffect(pos[i]) for i in reads if pos[i] is not None}
  effs |= {ji.WriteEffect(pos[i]) for i in writes if pos[i] is not None}
  return effs


def ref_shapes(avals, trees):
  refs, _ = split_refs(avals, trees)
  return [None if r is None else (view_shape(r[0].inner_aval, r[1]), r[0].inner_aval.dtype)
          for r in refs]


def primitive(name, abstract_eval):
  p = ji.Primitive(name)
  p.multiple_results = True
  p.def_effectful_abstract_eval(abstract_eval)
  return p


def bind_refs(p, refs, extra=(), **params):
  flat, trees = flatten_refs(*refs)
  return p.bind(*flat, *extra, trees=trees, **params)


# --- asynchronous copies ---------------------------------------------------------------------

def _copy_abstract_eval(*avals, trees, what, leader_tracked=None, **_):
  (src, sdt), (dst, ddt) = ref_shapes(avals, trees)[:2]
  views = (f"the source is {jnp.dtype(sdt).name}{list(src)} but the destination is "
           f"{jnp.dtype(ddt).name}{list(dst)}")
  if sdt != ddt:   # JAX's words first (users match them), then which views
    raise ValueError(f"{what}: Expected dtypes to match but src had type {jnp.dtype(sdt).name} "
                     f"and dst had type {jnp.dtype(ddt).name}: {views}; cast one of them "
                     "(copies do not convert)")
  partitioned = isinstance(leader_tracked, tuple) and leader_tracked[0] == "partitioned"
  if src != dst and not partitioned:   # (a partitioned copy's shapes: _check_partitioned)
    jax_words = (f"Expected source shape to be {tuple(dst)}, but got {tuple(src)}"
                 if what == "copy_gmem_to_smem" else
                 f"Expected shapes to match, but src has shape {tuple(src)} and dst has shape "
                 f"{tuple(dst)}")
    raise ValueError(f"{what}: {jax_words}: {views}; slice them to one shape")
  return [], ref_effects(trees, reads=(0,), writes=(1, 2))


copy_gmem_to_smem_p = primitive("copy_gmem_to_smem", _copy_abstract_eval)
copy_smem_to_gmem_p = primitive("copy_smem_to_gmem", _copy_abstract_eval)


def _predicate(predicate):
  return () if predicate is None else (jnp.asarray(predicate, jnp.bool_),)


def copy_gmem_to_smem(src, dst, barrier=None, *, collective_axes=None, leader_tracked=None,
                      oob_mode=None, predicate=None) -> None:
  """Starts copying the GMEM view ``src`` into the SMEM view ``dst`` (TMA: elements past the
  array's end read as zeros); its landing is one arrival on ``barrier``."""
  if isinstance(collective_axes, str):
    collective_axes = (collective_axes,)
  if leader_tracked is not None and not collective_axes:
    raise ValueError("`collective_axes` must be specified when `leader_tracked` is set")
  if isinstance(leader_tracked, tuple) and leader_tracked[0] == "partitioned":
    _check_partitioned(src, dst, leader_tracked[1], collective_axes)
  barrier = None if barrier is None else barrier_view(barrier)
  bind_refs(copy_gmem_to_smem_p, (src, dst, barrier), _predicate(predicate),
             what="copy_gmem_to_smem", has_predicate=predicate is not None,
             collective_axes=tuple(collective_axes or ()), leader_tracked=leader_tracked,
             oob_mode=oob_mode)


def _check_partitioned(src, dst, axis: int, collective_axes):
  """A partitioned cluster copy (each block receives its part of ``src``): its shapes are
  checked as JAX checks them (the interpreter runs it: clusters.py)."""
  size = lax.axis_size(tuple(collective_axes))
  want = tuple(d * size if i == axis else d for i, d in enumerate(dst.shape))
  if tuple(src.shape) != want:
    raise ValueError(f"Expected source shape to be {want}, but got {tuple(src.shape)}. Dim {axis} "
                     f"is partitioned over an axis of size {size}.")


def copy_smem_to_gmem(src, dst, predicate=None, *, commit_group=True, reduction_op=None) -> None:
  """Starts copying the SMEM view ``src`` to the GMEM view ``dst`` (elements past the array's end
  are dropped). ``wait_smem_to_gmem`` awaits it."""
  bind_refs(copy_smem_to_gmem_p, (src, dst, None), _predicate(predicate), what="copy_smem_to_gmem",
             has_predicate=predicate is not None, commit_group=bool(commit_group),
             reduction_op=reduction_op)


def no_ref_primitive(name):
  return primitive(name, lambda **_: ([], {mosaic_effect}))


commit_smem_p = no_ref_primitive("commit_smem")
commit_smem_to_gmem_group_p = no_ref_primitive("commit_smem_to_gmem_group")
wait_smem_to_gmem_p = no_ref_primitive("wait_smem_to_gmem")
wait_gmem_to_smem_p = no_ref_primitive("wait_gmem_to_smem")
wgmma_wait_p = no_ref_primitive("wgmma_wait")
set_max_registers_p = no_ref_primitive("set_max_registers")


def commit_smem() -> None:
  """Makes this thread's register writes to SMEM visible to TMA and wgmma."""
  commit_smem_p.bind()


def commit_smem_to_gmem_group() -> None:
  """Groups the SMEM->GMEM copies issued with ``commit_group=False`` so far."""
  commit_smem_to_gmem_group_p.bind()


def wait_smem_to_gmem(n: int, wait_read_only: bool = False) -> None:
  """Waits until at most the ``n`` most recent SMEM->GMEM copy groups of this thread are in flight."""
  wait_smem_to_gmem_p.bind(n=int(n), wait_read_only=bool(wait_read_only))


def wait_gmem_to_smem(n: int) -> None:
  """Waits for cp.async copies (pre-Hopper GMEM->SMEM without a barrier)."""
  wait_gmem_to_smem_p.bind(n=int(n))


def wgmma_wait(n: int) -> None:
  """Waits until at most ``n`` wgmma operations of this thread are in flight."""
  wgmma_wait_p.bind(n=int(n))


def set_max_registers(n: int, *, action: str) -> None:
  """Sets the registers per lane of this thread (a hint for the GPU; checked here)."""
  if action not in ("increase", "decrease"):
    raise ValueError(f"set_max_registers: action must be 'increase' or 'decrease', got {action!r}")
  if not 24 <= n <= 256 or n % 8:
    raise ValueError(f"set_max_registers({n}): the count must be a multiple of 8 in [24, 256]")
  set_max_registers_p.bind(n=int(n), action=action)


# --- barriers --------------------------------------------------------------------------------

def _barrier_abstract_eval(*avals, trees, **_):
  return [], ref_effects(trees, writes=(0,))


barrier_arrive_p = primitive("barrier_arrive", _barrier_abstract_eval)
barrier_wait_p = primitive("barrier_wait", _barrier_abstract_eval)


def barrier_arrive(barrier, *, predicate=None) -> None:
  """One arrival of this thread on ``barrier``."""
  bind_refs(barrier_arrive_p, (barrier_view(barrier),), _predicate(predicate),
             has_predicate=predicate is not None)


def barrier_wait(barrier) -> None:
  """Waits until ``barrier`` completes the phase this thread waits for next."""
  bind_refs(barrier_wait_p, (barrier_view(barrier),))


# --- wgmma -----------------------------------------------------------------------------------

def _wgmma_abstract_eval(*avals, trees):
  refs, rest = split_refs(avals, trees)
  acc = view_shape(refs[0][0].inner_aval, refs[0][1])
  a = rest[0].shape if refs[1] is None else view_shape(refs[1][0].inner_aval, refs[1][1])
  b = view_shape(refs[2][0].inner_aval, refs[2][1])
  if len(a) != 2 or len(b) != 2 or len(acc) != 2 or a[1] != b[0] or acc != (a[0], b[1]):
    raise ValueError(f"wgmma: acc{list(acc)} += a{list(a)} @ b{list(b)} does not match "
                     f"(JAX: Incompatible shapes for matrix multiplication: lhs={a}, rhs={b}, "
                     f"acc={acc}); a must be (M, K), b (K, N) and the accumulator (M, N)")
  a_dtype = rest[0].dtype if refs[1] is None else refs[1][0].inner_aval.dtype
  b_dtype = refs[2][0].inner_aval.dtype
  fp8 = (jnp.float8_e4m3fn, jnp.float8_e5m2)
  if a_dtype != b_dtype and not (a_dtype in fp8 and b_dtype in fp8):
    raise ValueError(f"wgmma: Mixed input dtypes for matrix multiplication unsupported: "
                     f"lhs={jnp.dtype(a_dtype).name}, rhs={jnp.dtype(b_dtype).name}; cast one "
                     "of them (only the two float8 types mix)")
  return [], ref_effects(trees, reads=(1, 2), writes=(0,))


wgmma_p = primitive("wgmma", _wgmma_abstract_eval)


def wgmma(acc, a, b) -> None:
  """``acc[...] += a @ b`` in float32, asynchronously: ``a`` is an SMEM Ref or a register value,
  ``b`` an SMEM Ref (``.transpose`` views allowed)."""
  a_ref = a if (isinstance(a, ji.TransformedRef) or ji.is_ref_aval(jax.typeof(a))) else None
  flat, trees = flatten_refs(acc, a_ref, b)
  if a_ref is None:
    flat.append(a)
  wgmma_p.bind(*flat, trees=trees)


# --- values ----------------------------------------------------------------------------------

layout_cast_p = ji.Primitive("layout_cast")
layout_cast_p.only_moves = True   # (sub-byte values move as they are: gpu/subbyte.py)
layout_cast_p.def_abstract_eval(lambda x, *, new_layout: x)
layout_cast_p.def_impl(lambda x, *, new_layout: x)


def layout_cast(x, new_layout):
  """Asks for ``x`` in ``new_layout`` (a register layout: the values are unchanged)."""
  return layout_cast_p.bind(x, new_layout=new_layout)


def broadcasted_iota(dtype, shape, dimension, *, layout=None):
  x = lax.broadcasted_iota(dtype, tuple(shape), dimension)
  return x if layout is None else layout_cast(x, layout)


def load(src, idx=(), *, layout=None, optimized=True):
  """Reads ``src[idx]`` into registers, in ``layout`` if given."""
  del optimized
  x = src[idx if idx != () else ...]
  return x if layout is None else layout_cast(x, layout)


def print_layout(fmt: str, x) -> None:
  """Prints the layout of ``x``: pallax picks layouts in the GPU backend (``debug=True`` shows them)."""
  del fmt, x


def transpose_ref(ref, permutation):
  """``ref.transpose(permutation)`` (JAX deprecates this spelling)."""
  return ref.transpose(tuple(permutation))


def wgmma_accumulator_load(acc, *, wait_n: int | None = 0):
  """Reads the accumulator ``acc`` after waiting until at most ``wait_n`` wgmma operations of
  this thread are in flight (``None``: no wait of its own). Reading an accumulator waits for
  the wgmmas into it in pallax, as ``acc[...]`` does."""
  if wait_n is not None and wait_n < 0:
    raise ValueError(f"wgmma_accumulator_load: wait_n must be non-negative, got {wait_n=}")
  if wait_n is not None:
    wgmma_wait(wait_n)
  return acc[...]


def async_prefetch(ref, *, collective_axes=None, leader_tracked=None, predicate=None) -> None:
  """Asks for the GMEM view ``ref`` in the L2 cache: a hint with no effect on results, which
  pallax's interpreter and its Gluon kernels leave out."""
  del collective_axes, leader_tracked, predicate
  prims.split_ref(ref)   # a Ref or a view, as in JAX


# --- a non-blocking barrier test, atomics, semaphores ------------------------------------------
# Gluon does not lower these yet: its code generator refuses them by their primitive's name.

def _barrier_test_abstract_eval(*avals, trees):
  if ref_shapes(avals, trees)[0][0] != ():
    raise ValueError("plgpu.barrier_test takes one barrier; index the barrier array (bar.at[i])")
  return [ji.ShapedArray((), jnp.bool_)], ref_effects(trees, writes=(0,))


barrier_test_p = primitive("plgpu_barrier_test", _barrier_test_abstract_eval)


def barrier_test(barrier) -> jax.Array:
  """Whether ``barrier`` completed the phase this thread waits for next, without waiting; if
  it did, the next ``barrier_wait``/``barrier_test`` is for the phase after it."""
  return bind_refs(barrier_test_p, (barrier_view(barrier),))[0]


def _atomic_abstract_eval(*avals, trees, op):
  ((shape, dtype),), (val,) = ref_shapes(avals, trees)[:1], avals[-1:]
  if tuple(val.shape) != shape:
    raise ValueError(f"plgpu.atomic_{op}: Invalid shape for the update: the Ref (view) is "
                     f"{list(shape)} but the value is {list(val.shape)}; they must match")
  if val.dtype != dtype:
    raise ValueError(f"plgpu.atomic_{op}: Invalid dtype: the Ref is {jnp.dtype(dtype).name} but "
                     f"the value is {jnp.dtype(val.dtype).name}; Expected dtypes to match "
                     "(cast the value with .astype)")
  if op in ("and", "or", "xor") and not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(f"plgpu.atomic_{op} takes integers, but the Ref holds "
                    f"{jnp.dtype(dtype).name}")
  return [], ref_effects(trees, reads=(0,), writes=(0,))


atomic_p = primitive("plgpu_atomic", _atomic_abstract_eval)


def _atomic_fn(op):
  def fn(ref, val) -> None:
    if isinstance(val, (int, float)):   # a Python number: the Ref's dtype, every element
      shape = view_shape(*_ref_type(ref))
      val = jnp.full(shape, val, _ref_type(ref)[0].dtype)
    bind_refs(atomic_p, (ref,), (jnp.asarray(val),), op=op)
  fn.__name__ = f"atomic_{op}"
  fn.__doc__ = (f"Updates every element of the SMEM or GMEM view ``ref`` with its {op} with "
                "``val``, atomically per element (other threads and blocks may update it too).")
  return fn


def _ref_type(ref):
  base, transforms = prims.split_ref(ref)
  return jax.typeof(base).inner_aval, transforms


atomic_add, atomic_max, atomic_min = (_atomic_fn(op) for op in ("add", "max", "min"))
atomic_and, atomic_or, atomic_xor = (_atomic_fn(op) for op in ("and", "or", "xor"))


def _one_semaphore(avals, trees, what):
  (shape, dtype), = ref_shapes(avals, trees)[:1]
  if shape != ():
    raise ValueError(f"{what} takes one semaphore, but the Ref is of shape {list(shape)}; index "
                     "the semaphore array (sems.at[i])")
  if not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"{what} takes a semaphore (pl.SemaphoreType.REGULAR), but the Ref holds "
                     f"{jnp.dtype(dtype).name}")


def _signal_abstract_eval(*avals, trees, memory_scope):
  _one_semaphore(avals, trees, "semaphore_signal")
  return [], ref_effects(trees, reads=(0,), writes=(0,))


def _wait_abstract_eval(*avals, trees, decrement, memory_scope):
  _one_semaphore(avals, trees, "semaphore_wait")
  return [], ref_effects(trees, reads=(0,), writes=(0,))


def _read_abstract_eval(*avals, trees):
  _one_semaphore(avals, trees, "semaphore_read")
  return [ji.ShapedArray((), jnp.int32)], ref_effects(trees, reads=(0,))


semaphore_signal_p = primitive("plgpu_semaphore_signal", _signal_abstract_eval)
semaphore_wait_p = primitive("plgpu_semaphore_wait", _wait_abstract_eval)
semaphore_read_p = primitive("plgpu_semaphore_read", _read_abstract_eval)


def _memory_scope(memory_scope):
  if memory_scope not in ("gpu", "sys"):
    raise ValueError(f"memory_scope must be 'gpu' or 'sys', got {memory_scope!r}")
  return memory_scope


def _local_only(sem, what: str) -> None:
  if any(isinstance(t, remote.PeerRef) for t in prims.split_ref(sem)[1]):
    raise ValueError(f"{what} takes a semaphore of this device, not a plgpu.remote_ref: a device "
                     "waits for its own semaphores, which its peers signal with device_id=")


def semaphore_signal(sem, inc=1, *, device_id=None, device_id_type=None, core_index=None,
                     memory_scope="gpu") -> None:
  """Adds ``inc`` to the semaphore ``sem``; with ``device_id``, to ``sem`` on that device of the
  mesh (a ``pl.get_global`` semaphore: see ``remote.remote_ref``)."""
  if core_index is not None:
    raise NotImplementedError("semaphore_signal(core_index=...) names a TPU core; Mosaic GPU "
                              "kernels have none (pass device_id to signal another device)")
  if device_id is not None:
    sem = remote.remote_ref(sem, device_id, device_id_type or remote.DeviceIdType.MESH)
  bind_refs(semaphore_signal_p, (sem,), (jnp.asarray(inc, jnp.int32),),
             memory_scope=_memory_scope(memory_scope))


def semaphore_wait(sem, value=1, *, decrement=True, memory_scope="gpu") -> None:
  """Waits until the semaphore ``sem`` holds at least ``value``, then subtracts ``value`` from
  it (unless ``decrement=False``)."""
  _local_only(sem, "semaphore_wait")
  bind_refs(semaphore_wait_p, (sem,), (jnp.asarray(value, jnp.int32),),
             decrement=bool(decrement), memory_scope=_memory_scope(memory_scope))


def semaphore_read(sem) -> jax.Array:
  """The value of the semaphore ``sem`` now."""
  _local_only(sem, "semaphore_read")
  return bind_refs(semaphore_read_p, (sem,))[0]


SEMAPHORES = semaphores.SemaphoreOps(semaphore_signal, semaphore_wait, semaphore_read)


# Kernels that use these are Mosaic GPU kernels: the eager interpreter or the Gluon backend runs them.
backends.register_kernel_primitives("mosaic_gpu", (
    copy_gmem_to_smem_p, copy_smem_to_gmem_p, barrier_arrive_p, barrier_wait_p, wgmma_p,
    commit_smem_p, wgmma_wait_p, wait_smem_to_gmem_p, commit_smem_to_gmem_group_p,
    barrier_test_p, atomic_p, semaphore_signal_p, semaphore_wait_p, semaphore_read_p))
