"""JAX's "hi" types (user types registered with ``jax.experimental.hijax``) as ``pallas_call``
operands and outputs.

A hi value is made of component arrays (``ty.lo_ty()``, ``ty.lower_val(v)``,
``ty.raise_val(*arrays)``). pallax splits each hi operand and output into its components at the
front end, so that the GridMapping, the interpreter and the GPU backends see arrays only:

* a hi operand's BlockSpec becomes one BlockSpec per component through the type's
  ``lower_block_spec(spec)`` (an operand without a spec, or with a spec without a block shape,
  has its components whole);
* the kernel receives one Ref of the hi type per hi operand, made of its components' block Refs
  (JAX's hi Refs: reading it gives the value raised from the components' reads, writing a hi value
  writes its components; a user's own high primitive reaches the component Refs through
  ``ref._refs``);
* ``input_output_aliases`` between hi operands alias component to component.
"""
from __future__ import annotations

from collections.abc import Sequence

from pallax._src import core as pc
from pallax._src import jax_internals as ji


def is_hi(aval) -> bool:
  return bool(getattr(aval, "is_high", False))


def lo_avals(aval) -> list:
  """The component types of ``aval`` (itself alone when it is an array type)."""
  return list(aval.lo_ty()) if is_hi(aval) else [aval]


def lower_value(aval, x) -> list:
  return list(aval.lower_val(x)) if is_hi(aval) else [x]


def raise_values(avals, lo_values) -> list:
  """The values of types ``avals`` made of the flat ``lo_values`` (components in order)."""
  lo_values, out = list(lo_values), []
  for aval in avals:
    n = len(lo_avals(aval))
    out.append(aval.raise_val(*lo_values[:n]) if is_hi(aval) else lo_values[0])
    lo_values = lo_values[n:]
  assert not lo_values, "more component values than the types take"
  return out


def _whole(spec) -> bool:
  """No spec, or one without a block shape (``pl.BlockSpec(memory_space=...)``): the whole array."""
  return spec is None or getattr(spec, "block_shape", None) is None


def lower_spec(spec, aval, origin: str, name: str) -> list:
  """``[(spec, component type, origin)]``: one entry per component of ``aval`` (one for an array)."""
  if not is_hi(aval):
    return [(spec, aval, origin)]
  los = lo_avals(aval)
  origins = [f"{origin} (component {j} of {type(aval).__name__})" for j in range(len(los))]
  if _whole(spec):   # each component whole (in the spec's memory space, if it names one)
    return [(spec, lo, o) for lo, o in zip(los, origins)]
  lower = getattr(aval, "lower_block_spec", None)
  if lower is None:
    raise NotImplementedError(
        f"pallas_call {name}: {origin} is of the hi type {aval}, which has no lower_block_spec "
        "method: pallax cannot tell which blocks of its component arrays a BlockSpec means. Define "
        f"{type(aval).__name__}.lower_block_spec(block_spec) (one BlockSpec per component of "
        "lo_ty()), or give this operand no BlockSpec (None: every component whole)")
  if spec.index_map is None:   # as JAX Pallas hands it over: an index map is always there
    nd = len(spec.block_shape)
    spec = pc.BlockSpec(spec.block_shape, lambda *_: (0,) * nd, spec.memory_space,
                        spec.pipeline_mode)
  specs = list(lower(spec))
  if len(specs) != len(los):
    raise ValueError(
        f"pallas_call {name}: {type(aval).__name__}.lower_block_spec gave {len(specs)} BlockSpecs "
        f"for {origin}, but its type has {len(los)} components (lo_ty()); give one per component")
  return list(zip(specs, los, origins))


def block_type(spec, aval, origin: str, name: str):
  """The hi type of ``aval``'s block, as the kernel's Ref holds it (None for an array)."""
  if not is_hi(aval):
    return None
  if _whole(spec):
    return aval
  shape = tuple(d.block_size for d in map(pc.canonical_block_dim, spec.block_shape)
                if not isinstance(d, pc.Squeezed))
  if shape == tuple(aval.shape):
    return aval
  try:
    return aval.update(shape=shape)
  except (NotImplementedError, TypeError, AttributeError) as e:
    raise NotImplementedError(
        f"pallas_call {name}: {origin} is of the hi type {aval}, whose blocks of shape {shape} "
        f"pallax cannot type: define {type(aval).__name__}.update(shape=...) (the type of a "
        f"block of that shape) ({type(e).__name__}: {e})") from None


def raise_refs(types: Sequence, lo_refs: Sequence) -> list:
  """The kernel's Refs: for each entry of ``types``, a hi Ref of that type made of the next
  components of ``lo_refs``, or (None) the next Ref itself. Refs past ``types`` stay as they are."""
  lo_refs, out = list(lo_refs), []
  for ty in types:
    if ty is None:
      out.append(lo_refs.pop(0))
    else:
      n = len(ty.lo_ty())
      out.append(ji.hi_ref(ty, lo_refs[:n]))
      lo_refs = lo_refs[n:]
  return out + lo_refs


def component_names(names: Sequence[str], types: Sequence) -> list[str]:
  """One name per component Ref: a hi Ref named ``x`` has components ``x_0``, ``x_1``, ..."""
  out = []
  for k, n in enumerate(names):
    ty = types[k] if k < len(types) else None
    out += [n] if ty is None else [f"{n}_{j}" for j in range(len(ty.lo_ty()))]
  return out


def lo_aliases(aliases, in_avals, out_avals) -> tuple:
  """``input_output_aliases`` over hi operands as pairs of flat component indices."""
  def starts(avals):
    firsts, k = [], 0
    for a in avals:
      firsts.append(k)
      k += len(lo_avals(a))
    return firsts
  ins, outs = starts(in_avals), starts(out_avals)
  return tuple((ins[i] + j, outs[o] + j) for i, o in aliases
               for j in range(len(lo_avals(in_avals[i]))))
