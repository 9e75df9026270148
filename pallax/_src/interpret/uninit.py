"""Uninitialized data in the interpreter of ``pallas_call`` kernels.

Output and scratch buffers start poisoned (``primitives.poison``). Where checks are on
(``pl.enable_debug_checks()`` or ``pl.InterpretParams(check_uninitialized=True)``), two checks
make that visible:

- Static (free): an output (not aliased to an input) with blocks that no program's block index
  reaches. Its elements can only come back as poison (on a GPU: whatever the memory held); the
  usual cause is a grid that does not cover the array.
- Dynamic: each program runs twice, its unwritten
  output and scratch elements filled with two different values (the poison, then another value,
  see ``second_fill``). An element a program stores that differs between the two runs was
  computed from an element no program wrote: an error, naming the program, the Ref and the
  kernel's lines that read outputs or scratch. An element equal to its fill in both runs was not
  written; every other element was, and counts as initialized from then on. At the end, output
  elements that no program wrote are an error naming the output, how many, and their region.

Reading an uninitialized element is allowed when the value does not matter (a masked load, a
``jnp.where`` that drops it, the padded part of an edge block): only values that reach memory
count. Off by default: the dynamic check doubles the interpreter's work, and kernels that leave
part of an output unwritten for their caller to drop run in JAX Pallas and on pallax's GPU
backends (JAX's and pallax's own tests have such kernels), so an error by default would break
the promise that changing the import changes nothing.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from pallax._src import checks
from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src import ref_access


def enabled(params) -> bool:
  """Whether the dynamic check runs: ``InterpretParams.check_uninitialized``, or when that is
  None, whether ``pl.enable_debug_checks()`` is on (read when the kernel is first run or
  lowered, as ``pl.debug_check`` reads it when traced)."""
  ip = params.interpret
  switch = getattr(ip, "check_uninitialized", None) if isinstance(ip, pc.InterpretParams) else None
  return pc.debug_checks_enabled() if switch is None else bool(switch)


second_fill = prims.other_poison


def scratch_second_fill(jaxpr):
  """``jaxpr`` with every ``pl.run_scoped`` allocation filled with the second fill, for the
  program's second run (scoped scratch is allocated inside the kernel, not passed to it)."""
  return jaxpr_util.retrace(
      jaxpr, lambda eqn, invals, params: jaxpr_util.rebind(eqn, invals, {**params, "second_fill": True}),
      lambda eqn: eqn.primitive is prims.run_scoped_p)


def filled(x, init, second: bool):
  """``x`` with its uninitialized elements (``init`` False) set to the first or second fill."""
  fill = (second_fill if second else prims.poison)(x.shape, x.dtype)
  return jnp.where(init, x, fill)


def _bits(x):
  if x.dtype == jnp.bool_:
    return x
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    return _bits(jnp.stack([jnp.real(x), jnp.imag(x)], -1))
  it = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
  return lax.bitcast_convert_type(x, it)


def _same(a, b):
  """Elementwise 'same bit pattern' (NaNs compare by their bits)."""
  same = _bits(a) == _bits(b)
  return jnp.all(same, -1) if jnp.issubdtype(a.dtype, jnp.complexfloating) else same


# --- per program -------------------------------------------------------------------------------

def check_program(kernel: str, ids, refs, reads: str):
  """``refs``: (name, value of run 1, value of run 2, init mask before or None when the Ref starts
  initialized). Fails if a stored value depends on uninitialized data; returns the init masks
  after the program (None for Refs given None)."""
  after = []
  for name, a, b, init in refs:
    differ = ~_same(a, b)
    if init is None:
      leak = differ
    else:
      unwritten = ~init & _same(a, prims.poison(a.shape, a.dtype)) & \
          _same(b, second_fill(b.shape, b.dtype))
      leak = differ & ~unwritten
      after.append(~unwritten)
    flat = leak.reshape(-1)
    who = ("program (" + ", ".join(f"{{p{i}}}" for i in range(len(ids))) + ")") if len(ids) \
        else "the kernel"
    checks.check(~jnp.any(flat),
                 _escape(f"pallas_call {kernel}: ") + who + _escape(
                     f" stores into {name} a value computed from output or scratch elements "
                     "that no program wrote (the first such element of its block: flat offset ")
                 + "{e}" + _escape(f"); {reads}. Write those elements before reading them, e.g. "
                                   "initialize an accumulator under @pl.when(pl.program_id(...) == 0)"),
                 **{f"p{i}": v for i, v in enumerate(ids)}, e=jnp.argmax(flat))
    if init is None:
      after.append(None)
  return after


def _escape(s: str) -> str:
  return s.replace("{", "{{").replace("}", "}}")


def read_lines(jaxpr, names: dict) -> str:
  """'the kernel reads out[0] at k.py:12 (k), scratch[0] at ...': where the kernel reads the
  Refs of ``names`` (outputs and scratch)."""
  found: dict = {}
  _collect_reads(jaxpr, names, found)
  if not found:
    return "the kernel reads no output or scratch directly (a sub-call may)"
  parts = [f"{n} at {', '.join(lines)}" for n, lines in found.items()]
  return "the kernel reads " + "; ".join(parts)


def _collect_reads(jaxpr, names, found):
  for eqn in jaxpr.eqns:
    if ref_access.is_access(eqn) and eqn.primitive in (ji.get_p, prims.masked_load_p, ji.addupdate_p):
      name = names.get(eqn.invars[0]) if isinstance(eqn.invars[0], ji.Var) else None
      if name is not None:
        line = ji.user_frame(eqn.source_info) or "a line of library code"
        if line not in found.setdefault(name, []):
          found[name].append(line)
    for sub in jaxpr_util.sub_jaxprs(eqn.params):
      inner = checks.sub_names(eqn, sub, names)
      scoped = sub.invars[eqn.params["num_consts"]:] if eqn.primitive is prims.run_scoped_p else ()
      tracked = set(names.values())
      _collect_reads(sub, {v: n for v, n in inner.items() if n in tracked or v in scoped}, found)


# --- at the end ----------------------------------------------------------------------------------

def check_all_written(kernel: str, origin: str, init):
  """Fails if elements of an output (its unpadded ``init`` mask) were written by no program."""
  missing = ~init
  shape = init.shape
  region, fmt = [], {}
  for d, size in enumerate(shape):
    along = jnp.any(missing, axis=tuple(k for k in range(len(shape)) if k != d)) if shape else missing
    fmt[f"lo{d}"] = jnp.argmax(along)
    fmt[f"hi{d}"] = size - jnp.argmax(along[::-1])
    region.append(f"{{lo{d}}}:{{hi{d}}}")
  where = f"[{', '.join(region)}]" if shape else "its only element"
  checks.check(~jnp.any(missing),
               _escape(f"pallas_call {kernel}: no program wrote ") + "{count}" + _escape(
                   f" of the {math.prod(shape)} elements of {origin} (shape {tuple(shape)}), "
                   "within ") + where + _escape(
                   f" (the smallest box holding them): {origin} would return poison there "
                   "(NaN, the smallest integer, True; on a GPU whatever the memory held). The "
                   "programs whose blocks hold them did not store to them: a store under "
                   "pl.when or a mask, or a store of a smaller slice than the block"),
               count=jnp.sum(missing, dtype=jnp.int32), **fmt)


# --- static coverage -----------------------------------------------------------------------------

def check_coverage(params, plan) -> None:
  """Raises ValueError for an output (not aliased) with blocks that no program's index map
  reaches. Free: it reads the plan's block-index tables (known unless an index map reads
  scalar-prefetch operands)."""
  gm = params.grid_mapping
  aliased = {o for _, o in params.input_output_aliases}
  nin = gm.num_inputs
  for k, bm in enumerate(gm.block_mappings_output):
    view, table = plan.blocks[nin + k], plan.tables[nin + k]
    if k in aliased or table is None or any(view.element) or not view.array_shape:
      continue
    counts = tuple(m + 1 for m in view.max_index)
    seen = np.zeros(counts, bool)
    seen[tuple(table.reshape(-1, len(counts)).T.astype(np.int64))] = True
    if seen.all():
      continue
    raise ValueError(_coverage_message(params.name, gm.grid, view, seen))


def _coverage_message(kernel: str, grid, view, seen) -> str:
  shape, block = view.array_shape, view.block_shape
  missing = np.argwhere(~seen)
  lo = [int(missing[:, d].min()) * b for d, b in enumerate(block)]
  hi = [min(int(missing[:, d].max() + 1) * b, s) for d, (b, s) in enumerate(zip(block, shape))]
  count = sum(math.prod(min((i + 1) * b, s) - i * b for i, b, s in zip(idx, block, shape))
              for idx in missing)
  region = ", ".join(f"{a}:{b}" for a, b in zip(lo, hi))
  short = [d for d, (n, b) in enumerate(zip(seen.shape, block)) if not seen.any(
      axis=tuple(k for k in range(seen.ndim) if k != d))[-1]]
  hint = ""
  if short and len(grid) >= 1:
    d = short[0]
    hint = (f"; if the grid runs over dimension {d} of {view.origin}, give it "
            f"pl.cdiv({shape[d]}, {block[d]}) = {-(-shape[d] // block[d])} programs along "
            f"that axis, not {shape[d]} // {block[d]} = {shape[d] // block[d]}")
  return (f"pallas_call {kernel}: no program writes {count} of the {math.prod(shape)} elements "
          f"of {view.origin} (shape {tuple(shape)}, blocks {tuple(block)}), within "
          f"[{region}]: no block index of its index_map over the grid {tuple(grid)} reaches "
          f"them, so they would come back as poison (on a GPU, whatever the memory held){hint}")
