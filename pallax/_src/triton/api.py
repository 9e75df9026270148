"""``pallax.triton``: compiler params, Triton-specific kernel functions, and ``lower``."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallax._src import ref_access
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.call_primitive import pallas_call_p
from pallax._src import primitives as prims
from pallax._src.primitives import dot, max_contiguous  # noqa: F401  (re-exported)
from pallax._src.triton import codegen
from pallax._src.triton.compile import Compiled, compile_kernel
from pallax._src.triton.params import CompilerParams  # noqa: F401  (re-exported)
from pallax._src.gpu import expr as ex
from pallax._src.gpu.source import Unsupported
from pallax._src.triton import lang as tl
from pallax._src.triton import memory
from pallax._src.triton.writer import rule


# --- Ref access, as in JAX Pallas's Triton module: the Ref (view) is the index -----------

def load(x_ref_or_view, *, mask=None, other=None, cache_modifier=None, eviction_policy=None,
         volatile=False):
  """Reads the whole Ref or ``ref.at[...]`` view; lanes where ``mask`` is False read ``other``."""
  return prims.load(x_ref_or_view, (), mask=mask, other=other, cache_modifier=cache_modifier,
                    eviction_policy=eviction_policy, volatile=volatile)


def store(x_ref_or_view, val, *, mask=None, eviction_policy=None):
  """Writes ``val`` to the whole Ref or ``ref.at[...]`` view, only where ``mask`` is True."""
  prims.store(x_ref_or_view, (), val, mask=mask, eviction_policy=eviction_policy)


# --- atomics -----------------------------------------------------------------------------

atomic_p = ji.Primitive("atomic_rmw")       # (ref, val, *indexer leaves, [mask])
atomic_cas_p = ji.Primitive("atomic_cas")   # (ref, cmp, val, *indexer leaves)


def _n_values(op):
  return 2 if op == "cas" else 1


def _atomic_abstract_eval(ref, *args, tree, op, has_mask):
  leaves = args[_n_values(op):][:tree.num_leaves]
  shape = prims.view_shape(ref, ji.tree_util.tree_unflatten(tree, leaves))
  return ji.ShapedArray(shape, ref.dtype), {ji.WriteEffect(0), ji.ReadEffect(0)}


_COMBINE = {"add": jnp.add, "max": jnp.maximum, "min": jnp.minimum, "and": jnp.bitwise_and,
            "or": jnp.bitwise_or, "xor": jnp.bitwise_xor, "xchg": lambda old, v: v,
            "cas": lambda old, cmp, v: jnp.where(old == cmp, v, old)}


def _atomic_discharge(ctx, x, *args, tree, op, has_mask):
  """One lane after another, in row-major order: lanes that hit the same element all apply (as
  on a GPU, where only their order differs), and each returns the value it found."""
  nv, n = _n_values(op), tree.num_leaves
  vals, leaves = args[:nv], args[nv:nv + n]
  mask = args[nv + n] if has_mask else None
  transforms = ji.tree_util.tree_unflatten(tree, leaves)   # ref.at[...] views, then the index
  coords = tuple(prims.base_coords(transforms))
  shape = coords[0].shape if coords else x.shape
  lanes = [c.ravel() for c in coords] if coords else \
      [c.ravel() for c in jnp.indices(x.shape, sparse=False)]
  vals = [jnp.broadcast_to(v, shape).ravel() for v in vals]
  keep = jnp.broadcast_to(mask, shape).ravel() if mask is not None else jnp.ones(lanes[0].shape, bool)

  def step(x, lane):
    c, v, k = lane
    old = x[tuple(c)]
    return x.at[tuple(c)].set(jnp.where(k, _COMBINE[op](old, *v), old)), old

  x, old = jax.lax.scan(step, x, (lanes, vals, keep))
  return (x,) + (None,) * len(args), old.reshape(shape)


for _p in (atomic_p, atomic_cas_p):
  _p.def_effectful_abstract_eval(_atomic_abstract_eval)
  ji.register_discharge_rule(_p)(_atomic_discharge)
ref_access.register(atomic_p, 1, "atomic update of")     # (ref, val, *leaves, [mask])
ref_access.register(atomic_cas_p, 2, "atomic update of")  # (ref, cmp, val, *leaves)


def _atomic(op, x_ref_or_view, idx, vals, mask=None):
  base, flat, tree = prims.flat_access(x_ref_or_view, idx)
  extra = [jnp.asarray(mask)] if mask is not None else []
  p = atomic_cas_p if op == "cas" else atomic_p
  return p.bind(base, *vals, *flat, *extra, tree=tree, op=op, has_mask=mask is not None)


def _atomic_fn(op):
  def fn(x_ref_or_view, idx, val, *, mask=None, sem=None, scope=None):
    """Atomically combines ``val`` into ``x_ref[idx]``; returns the old values."""
    del sem, scope
    return _atomic(op, x_ref_or_view, idx, [jnp.asarray(val)], mask)
  fn.__name__ = f"atomic_{op}"
  return fn


atomic_add, atomic_max, atomic_min = _atomic_fn("add"), _atomic_fn("max"), _atomic_fn("min")
atomic_and, atomic_or, atomic_xor = _atomic_fn("and"), _atomic_fn("or"), _atomic_fn("xor")
atomic_xchg = _atomic_fn("xchg")


def atomic_cas(ref, cmp, val):
  """Where ``ref[...] == cmp`` writes ``val``; returns the old values."""
  return _atomic("cas", ref, (), [jnp.asarray(cmp), jnp.asarray(val)])


@rule(atomic_p, atomic_cas_p, hint="old")
def _atomic_lowering(ctx, *invals, op, **_):
  view, acc = memory.view(ctx, invals)
  offs, mask, shape = memory.address(view, acc.mask)
  ptr = view.ptr if ex.is_zero(offs) else ex.binary("+", view.ptr, offs)
  if op == "cas":
    if mask is not None:   # tl.atomic_cas takes no mask
      raise Unsupported("atomic_cas on a block that needs a mask (a partial or "
                        "non-power-of-two block)")
    return ex.call("tl.atomic_cas", ptr, *acc.values, dtype=view.dtype, shape=shape)
  kw = {"mask": mask} if mask is not None else {}
  return ex.call(f"tl.atomic_{op}", ptr, acc.values[0], dtype=view.dtype, shape=shape, **kw)


# --- other Triton-specific functions ---------------------------------------------------------

approx_tanh_p = ji.Primitive("approx_tanh")
approx_tanh_p.def_abstract_eval(lambda x: x)
approx_tanh_p.def_impl(jnp.tanh)
ji.mlir.register_lowering(approx_tanh_p, ji.mlir.lower_fun(jnp.tanh, multiple_results=False))
ji.batching.primitive_batchers[approx_tanh_p] = lambda args, dims: (approx_tanh_p.bind(*args), dims[0])


def approx_tanh(x):
  """tanh with the GPU's fast approximate instruction (exact tanh in the interpreter)."""
  return approx_tanh_p.bind(jnp.asarray(x))


@rule(approx_tanh_p, hint="tanh")
def _approx_tanh_lowering(ctx, x):
  if x.dtype == jnp.float64:
    return ex.call("libdevice.tanh", x, dtype=x.dtype, shape=x.shape)
  if x.dtype != jnp.float32:   # f16/bf16 through float32
    y = ex.call("libdevice.tanh", tl.to(x, jnp.float32), dtype=tl.F32, shape=x.shape)
    return tl.to(y, x.dtype)
  return ex.Call("tl.inline_asm_elementwise",
                 ("tanh.approx.f32 $0, $1;", "=r,r", ex.Token(f"[{tl.render(x)}]")),
                 (("dtype", tl.dtype(jnp.float32)), ("is_pure", True), ("pack", 1)),
                 dtype=x.dtype, shape=x.shape)


barrier_p = ji.Primitive("debug_barrier")
barrier_p.multiple_results = True
barrier_p.def_effectful_abstract_eval(lambda: ([], {ji.debug_effect}))
barrier_p.def_impl(lambda: [])
ji.mlir.register_lowering(barrier_p, lambda ctx: [])


def debug_barrier():
  """Synchronizes the threads of a program (a no-op in the interpreter)."""
  barrier_p.bind()


@rule(barrier_p)
def _barrier_lowering(ctx):
  ctx.gen.emit("tl.debug_barrier()")
  return []

inline_asm_p = ji.Primitive("elementwise_inline_asm")
inline_asm_p.multiple_results = True
inline_asm_p.def_abstract_eval(
    lambda *args, asm, constraints, pack, result_shape_dtypes: [
        ji.ShapedArray(s.shape, s.dtype) for s in result_shape_dtypes])


def _no_asm_in_interpreter(*args, **kw):
  raise NotImplementedError("elementwise_inline_asm runs PTX, which the interpreter cannot "
                            "execute; write the operation with jnp for the interpreter")


ji.mlir.register_lowering(inline_asm_p, lambda ctx, *a, **kw: _no_asm_in_interpreter())
inline_asm_p.def_impl(_no_asm_in_interpreter)


def elementwise_inline_asm(asm: str, *, args, constraints: str, pack: int, result_shape_dtypes):
  """Inline PTX applied elementwise (Triton only)."""
  return inline_asm_p.bind(*args, asm=asm, constraints=constraints, pack=pack,
                           result_shape_dtypes=tuple(result_shape_dtypes))


@rule(inline_asm_p, hint="asm")
def _inline_asm_lowering(ctx, *args, asm, constraints, pack, result_shape_dtypes):
  dtypes = [tl.render(tl.dtype(s.dtype)) for s in result_shape_dtypes]
  dt = ex.Token(dtypes[0] if len(dtypes) == 1 else f"({', '.join(dtypes)},)")
  arg_list = ex.Token(f"[{', '.join(tl.render(a) for a in args)}]")
  e = ex.Call("tl.inline_asm_elementwise", (asm, constraints, arg_list),
              (("dtype", dt), ("is_pure", True), ("pack", pack)))
  if len(result_shape_dtypes) == 1:
    s = result_shape_dtypes[0]
    return [ex.Call(e.fn, e.args, e.kwargs, dtype=np.dtype(s.dtype), shape=tuple(s.shape))]
  tup = ctx.gen.fresh("asm")
  ctx.gen.emit(f"{tup} = {tl.render(e)}")
  return [ex.Subscript(ex.Name(tup), (ex.Token(str(i)),), dtype=np.dtype(s.dtype), shape=tuple(s.shape))
          for i, s in enumerate(result_shape_dtypes)]


# --- inspection without a GPU ------------------------------------------------------------------

# What lower() returns per pallas_call: name, source (the generated Triton), ttir, ptx,
# shared_mem_bytes, num_warps, num_stages, grid (and what the launcher needs).
KernelArtifact = Compiled


def _pallas_call_params(jaxpr):
  for eqn in jaxpr_util.equations(jaxpr):
    if eqn.primitive is pallas_call_p:
      yield eqn.params["params"]


def lower(fun, *args, compute_capability: int = 90, **kwargs) -> list[KernelArtifact]:
  """Traces ``fun(*args)`` (arrays or ``jax.ShapeDtypeStruct``s) and compiles every pallas_call
  in it for ``sm_<compute_capability>``; needs no GPU."""
  from pallax._src.triton.launch import check_compute_capability
  closed = jax.make_jaxpr(functools.partial(fun, **kwargs))(*args)
  out = []
  for params in _pallas_call_params(closed.jaxpr):
    check_compute_capability(compute_capability, params.name)
    ks = codegen.generate(params, compute_capability)
    out.append(compile_kernel(ks, compute_capability, params.name))
  return out
