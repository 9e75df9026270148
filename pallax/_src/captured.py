"""Values a kernel closes over, by JAX Pallas's rules.

Tracing a kernel turns the arrays it closes over (a NumPy or JAX array from outside, an array
built from Python data such as ``jnp.array([1, 2])``, a NumPy index array) into constants of
its jaxpr; Python and NumPy scalars become literals instead. JAX Pallas refuses the constants:
``pallas_call`` every one that is not a Ref ("captures constants"), ``pl.kernel`` the ones that
are not scalars ("captures non-scalar array constants"). With JAX's
``jax_use_simplified_jaxpr_constants`` on, arrays are literals too and both accept them; so do
these checks, which look at the same constants.
"""
from __future__ import annotations

import jax
import numpy as np

from pallax._src import jax_internals as ji


def _is_ref(c) -> bool:
  return ji.is_ref_aval(jax.typeof(c))


def _used_at(jaxpr, var) -> str | None:
  """The user's source line of the first equation that reads constant ``var``."""
  for eqn in jaxpr.eqns:
    if any(v is var for v in eqn.invars):
      return ji.user_frame(eqn.source_info)
  return None


def _holds_data(c) -> bool:
  """Not an empty array (the index array that ``x.at[...]`` makes: JAX Pallas refuses it too,
  but it carries nothing to pass in)."""
  return _is_ref(c) or jax.typeof(c).size > 0


def _listing(jaxpr, consts, bad) -> str:
  """'float32[1,128] (used at file:line (kernel)), ...' for the refused constants."""
  items = []
  # JAX's trace gives the constants' variables as the jaxpr's leading inputs (or as constvars)
  const_vars = jaxpr.constvars if len(jaxpr.constvars) == len(consts) else jaxpr.invars[:len(consts)]
  for var, c in zip(const_vars, consts):
    if _holds_data(c) and bad(c):
      at = _used_at(jaxpr, var)
      items.append(jax.typeof(c).str_short() + (f" (used at {at})" if at else ""))
  return ", ".join(items)


def check_pallas_call(jaxpr, consts, name: str, where: str | None):
  """JAX Pallas's rule for ``pallas_call``: a kernel may close over Refs (not traced ones: those
  of an enclosing jit), never over arrays."""
  arrays = _listing(jaxpr, consts, lambda c: not _is_ref(c))
  if arrays:
    raise ValueError(   # JAX's words first: users match them
        f"The kernel function in the pallas_call {name}{f' at {where}' if where else ''} "
        f"captures constants [{arrays}]. You should pass them as inputs: give each array to "
        "pallas_call as an operand (the kernel gets a Ref to it), or compute it in the kernel "
        "(jnp.arange, lax.iota, jnp.full); Python and NumPy scalars may be closed over")
  for c in consts:
    if isinstance(c, jax.core.Tracer):
      raise ValueError(
          f"pallas_call {name}: the kernel closes over a traced Ref of type {jax.typeof(c)}; "
          "pass its value to pallas_call as an operand instead")


def check_kernel(jaxpr, consts, name: str, where: str | None):
  """JAX's rule for ``pl.kernel`` (and ``plgpu.kernel``): scalars and Refs may be closed over,
  arrays must be inputs. A traced scalar (a value of an enclosing ``jax.jit``) cannot be."""
  not_scalar = lambda c: not _is_ref(c) and jax.typeof(c).shape != ()
  arrays = _listing(jaxpr, consts, not_scalar)
  at = f" at {where}" if where else ""
  if arrays:
    raise ValueError(   # JAX's words first: users match them
        f"The kernel function in pl.kernel {name}{at} captures non-scalar array constants "
        f"[{arrays}]. You can only close over scalars and Refs; arrays must be passed as "
        "explicit inputs (operands of the kernel call, which the body gets as Refs)")
  traced = _listing(jaxpr, consts, lambda c: isinstance(c, jax.core.Tracer) and not _is_ref(c))
  if traced:
    raise ValueError(
        f"pl.kernel {name}{at}: the body closes over traced scalars [{traced}] (values of an "
        "enclosing jax.jit or vmap); pass them to the kernel as inputs instead")


def check(closure: str, jaxpr, consts, name: str, where: str | None):
  """The rule of ``closure`` ("pallas_call" or "kernel") for the traced kernel's constants."""
  if closure == "kernel":
    check_kernel(jaxpr, consts, name, where)
  else:
    check_pallas_call(jaxpr, consts, name, where)


def as_literal(c):
  """A scalar constant of a probed ``pl.kernel`` body as a NumPy scalar, which a new trace
  inlines as a literal (rather than capturing it again as a constant); an empty array as a
  NumPy array."""
  if _is_ref(c) or isinstance(c, jax.core.Tracer):
    return c
  a = np.asarray(c)
  return a[()] if a.ndim == 0 else a   # else empty: allowed, it carries no data
