"""``lax.scan`` over arrays, as both GPU backends lower it: a jaxpr rewrite.

A GPU program cannot index its registers with a loop counter, so a scan whose body takes a row
of each ``xs`` and gives a row of each ``ys`` becomes, before a backend sees it::

    run_scoped(xs_refs, ys_refs):                  # scratch of the backend's choice
      xs_ref[...] = xs
      carry = fori_loop(0, length, step, carry)    # step k: body(carry, xs_ref[k]) -> ys_ref[k]
      ys = ys_ref[...]

(``reverse`` walks the rows from the last). The backend lowers the scratch, the loop and the
row accesses with the rules it has for them. The Gluon backend takes it (its scratch: shared
memory, whose hazards Gluon's compiler guards). The Triton backend writes its own loop
(``triton/control._scan_arrays``): its scratch is global memory, and its Ref rules put a block
barrier after every store to scratch read again, which in this form would be two barriers a
step where its loop needs one after the last. Scans whose body gives a Ref at each step are
left as they are (the backends refuse them by name).
"""
from __future__ import annotations

from collections.abc import Callable

from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims


def _over_arrays(eqn) -> bool:
  if eqn.primitive is not ji.scan_p:
    return False
  p = eqn.params
  nc, ncarry, nxs = (len(s) for s in p["ft_in"].unpack())
  nys = len(eqn.outvars) - ncarry
  return bool(nxs or nys) and not any(ji.is_ref_aval(v.aval) for v in eqn.outvars[ncarry:])


def _rows(shape) -> tuple:
  """The scratch shape holding arrays of ``shape`` by rows: scalar rows as rows of one element
  (a GPU program indexes memory by rows of at least one element)."""
  return tuple(shape) if len(shape) > 1 else (shape[0], 1)


def _row(ref, k, shape):
  """Row ``k`` of ``ref``, of ``shape``."""
  return ref[k].reshape(shape)


def scans_over_scratch(jaxpr, scratch: Callable) -> ji.Jaxpr:
  """``jaxpr`` with every scan over arrays (xs or ys) written as a loop over the rows of
  scratch Refs; ``scratch(shape, dtype)``: the backend's scratch type for ``pl.run_scoped``."""
  def rule(eqn, invals, params):
    nc, ncarry, nxs = (len(s) for s in params["ft_in"].unpack())
    consts, init, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]
    body, length, reverse = params["jaxpr"], params["length"], params["reverse"]
    y_avals = [v.aval for v in eqn.outvars[ncarry:]]

    def scoped(*refs):
      x_refs, y_refs = refs[:nxs], refs[nxs:]
      for r, x in zip(x_refs, xs):
        r[...] = x.reshape(r.shape)

      def step(k, carry):
        row = length - 1 - k if reverse else k
        x_rows = [_row(r, row, x.shape[1:]) for r, x in zip(x_refs, xs)]
        outs = ji.eval_jaxpr(body.jaxpr, body.consts, *consts, *carry, *x_rows)
        for r, y in zip(y_refs, outs[ncarry:]):
          r[row] = y.reshape(r.shape[1:])
        return tuple(outs[:ncarry])
      carry = lax.fori_loop(0, length, step, tuple(init))
      return [*carry, *[r[...].reshape(a.shape) for r, a in zip(y_refs, y_avals)]]
    types = [scratch(_rows(x.shape), x.dtype) for x in xs]
    types += [scratch(_rows(a.shape), a.dtype) for a in y_avals]
    return prims.run_scoped(scoped, *types)
  return jaxpr_util.retrace(jaxpr, rule, _over_arrays)
