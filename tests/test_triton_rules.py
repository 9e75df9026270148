"""The Triton rules that keep lax's meaning themselves (not through legalization): NaN-winning
max/min and the identities that padded lanes get before reductions. Checked on the expression
trees the rules return (data, not generated text)."""
import types

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallax._src import jax_internals as ji
from pallax._src.gpu import expr as ex
from pallax._src.gpu.source import RuleContext
from pallax._src.triton import reductions, rules  # noqa: F401  (registers the rules)
from pallax._src.triton.writer import TABLE, Writer


def _ctx(prim, out_shape, out_dtype):
  out = types.SimpleNamespace(aval=ji.ShapedArray(out_shape, out_dtype))
  eqn = types.SimpleNamespace(primitive=prim, outvars=[out], invars=[])
  return RuleContext(Writer("k", 90), eqn)


def _value(name, shape, dtype):
  return ex.Name(name, dtype=np.dtype(dtype), shape=shape)


def _nodes(e):
  """Every node of an expression tree."""
  yield e
  children = ()
  if isinstance(e, ex.Op):
    children = e.args
  elif isinstance(e, ex.Call):
    children = (*e.args, *(v for _, v in e.kwargs), *([e.fn] if isinstance(e.fn, ex.Expr) else []))
  elif isinstance(e, (ex.Attr, ex.Subscript)):
    children = (e.obj,)
  for c in children:
    if isinstance(c, ex.Expr):
      yield from _nodes(c)


@pytest.mark.parametrize("prim", [lax.max_p, lax.min_p])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16, jnp.float64, jnp.int32])
def test_max_min_let_nan_win(prim, dtype):
  x, y = _value("x", (8,), dtype), _value("y", (8,), dtype)
  e = TABLE.rules[prim](_ctx(prim, (8,), dtype), x, y)
  (call,) = [n for n in _nodes(e) if isinstance(n, ex.Call) and n.fn in ("tl.maximum", "tl.minimum")]
  kw = dict(call.kwargs)
  if jnp.issubdtype(dtype, jnp.floating):
    assert isinstance(kw.get("propagate_nan"), ex.Token) and kw["propagate_nan"].text.endswith(".ALL")
  else:
    assert "propagate_nan" not in kw
  if np.dtype(dtype).itemsize == 2:   # Triton answers in f32: converted back to the operands' type
    assert isinstance(e.fn, ex.Attr) and e.fn.attr == "to" and e.dtype == np.dtype(dtype)


_IDENTITY = [  # (reduction, dtype, the value padded lanes must hold)
    (lax.reduce_max_p, jnp.float32, -np.inf), (lax.reduce_min_p, jnp.float32, np.inf),
    (lax.reduce_max_p, jnp.bfloat16, -np.inf), (lax.reduce_max_p, jnp.int8, -128),
    (lax.reduce_min_p, jnp.uint8, 255), (lax.reduce_min_p, jnp.int32, 2**31 - 1),
    (lax.reduce_max_p, jnp.uint32, 0), (lax.reduce_sum_p, jnp.float32, 0),
    (lax.reduce_sum_p, jnp.int16, 0), (lax.reduce_prod_p, jnp.float32, 1),
    (lax.reduce_and_p, jnp.int32, -1), (lax.reduce_and_p, jnp.uint16, 65535),
    (lax.reduce_and_p, jnp.bool_, 1), (lax.reduce_or_p, jnp.bool_, 0),
    (lax.reduce_xor_p, jnp.int32, 0), (lax.reduce_max_p, jnp.bool_, 0),
    (lax.reduce_min_p, jnp.bool_, 1),
]


def _padding_fill(e, rows, width):
  """The value a rule puts in the padded lanes of a (rows, width) operand: the third argument of
  the ``tl.where`` whose condition compares lanes with ``width``."""
  for n in _nodes(e):
    if isinstance(n, ex.Call) and n.fn == "tl.where":
      conds = [c for c in _nodes(n.args[0]) if isinstance(c, ex.Op) and c.op == "<"]
      if any(ex.literal(c.args[1]) == width for c in conds):
        fill = n.args[2]
        return float(ex.literal(fill)) if isinstance(fill, ex.Lit) else float(fill.text.replace("INF", "inf"))
  return None


@pytest.mark.parametrize("prim,dtype,identity", _IDENTITY,
                         ids=[f"{p.name}-{np.dtype(d).name}" for p, d, _ in _IDENTITY])
def test_padded_lanes_hold_the_reduction_identity(prim, dtype, identity):
  x = _value("x", (4, 100), dtype)   # 100 lanes padded to 128
  e = TABLE.rules[prim](_ctx(prim, (4,), dtype), x, axes=(1,))
  assert _padding_fill(e, 4, 100) == identity


@pytest.mark.parametrize("prim,identity", [(lax.argmax_p, -np.inf), (lax.argmin_p, np.inf)])
def test_argmax_padding(prim, identity):
  x = _value("x", (4, 100), jnp.float32)
  e = TABLE.rules[prim](_ctx(prim, (4,), jnp.int32), x, axes=(1,), index_dtype=jnp.int32)
  assert _padding_fill(e, 4, 100) == identity
  (arg,) = [n for n in _nodes(e) if isinstance(n, ex.Call) and n.fn == f"tl.{prim.name}"]
  assert dict(arg.kwargs)["tie_break_left"] is True


def test_exact_widths_need_no_padding():
  x = _value("x", (4, 128), jnp.float32)
  e = TABLE.rules[lax.reduce_max_p](_ctx(lax.reduce_max_p, (4,), jnp.float32), x, axes=(1,))
  assert not any(isinstance(n, ex.Call) and n.fn == "tl.where" for n in _nodes(e))
