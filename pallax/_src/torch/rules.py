"""lax primitives evaluated on torch tensors: the array code around pallas_calls in a function
given to ``as_torch_kernel`` (reshapes, the reductions that combine a split-K kernel's partial
results, ...). One rule per primitive; a primitive not here is a clear error."""
from __future__ import annotations

import jax
import numpy as np


def import_torch():
  try:
    import torch
  except ImportError as e:
    raise ImportError("pallax.as_torch_kernel needs PyTorch (pip install torch); pallax itself "
                      "does not depend on it") from e
  return torch


def torch_dtype(dtype):
  """The torch dtype of a NumPy/JAX dtype (ValueError for one torch lacks)."""
  torch = import_torch()
  name = np.dtype(dtype).name
  table = {"bool": torch.bool, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
           "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
           "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
           "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
           "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
  if name not in table:
    raise ValueError(f"as_torch_kernel: dtype {name} has no torch equivalent")
  return table[name]


def _divide(x, y):
  torch = import_torch()
  floating = (x.is_floating_point() if isinstance(x, torch.Tensor) else isinstance(x, float))
  return torch.div(x, y) if floating else torch.div(x, y, rounding_mode="trunc")   # lax: C division


def _broadcast_in_dim(x, *, shape, broadcast_dimensions, **_):
  kept = [1] * len(shape)
  for src, dst in enumerate(broadcast_dimensions):
    kept[dst] = x.shape[src]
  return x.reshape(kept).expand(*shape)


def _pad(x, padding_value, *, padding_config):
  torch = import_torch()
  if any(interior for _, _, interior in padding_config):
    raise NotImplementedError("as_torch_kernel: lax.pad with interior padding")
  widths = [w for lo, hi, _ in reversed(padding_config) for w in (lo, hi)]   # last dim first
  value = padding_value.item() if isinstance(padding_value, torch.Tensor) else padding_value
  return torch.nn.functional.pad(x, widths, value=value)


def _slice(x, *, start_indices, limit_indices, strides):
  index = tuple(slice(s, e, st) for s, e, st in zip(start_indices, limit_indices, strides or
                                                        [1] * len(start_indices)))
  return x[index]


def _select_n(which, *cases):
  torch = import_torch()
  if len(cases) != 2:
    raise NotImplementedError("as_torch_kernel: select_n with more than two cases")
  return torch.where(which.bool(), cases[1], cases[0])


def _dot_general(x, y, *, dimension_numbers, preferred_element_type=None, **_):
  """lax.dot_general as an einsum: batch dimensions, then x's free ones, then y's; computed in
  the preferred type."""
  (xc, yc), (xb, yb) = dimension_numbers
  letters = iter("abcdefghijklmnopqrstuvwxyz")
  xs = [next(letters) for _ in range(x.dim())]
  ys = [next(letters) for _ in range(y.dim())]
  for i, j in [*zip(xc, yc), *zip(xb, yb)]:
    ys[j] = xs[i]
  out = [xs[i] for i in xb] + [c for i, c in enumerate(xs) if i not in xc and i not in xb] + \
      [c for j, c in enumerate(ys) if j not in yc and j not in yb]
  if preferred_element_type is not None:
    x, y = x.to(torch_dtype(preferred_element_type)), y.to(torch_dtype(preferred_element_type))
  return import_torch().einsum(f"{''.join(xs)},{''.join(ys)}->{''.join(out)}", x, y)


def _reduce(name):
  def rule(x, *, axes, **_):
    torch = import_torch()
    if not axes:
      return x
    if name == "sum":
      return torch.sum(x, dim=tuple(axes))
    return torch.amax(x, dim=tuple(axes)) if name == "max" else torch.amin(x, dim=tuple(axes))
  return rule


def _binary(fn_name):
  def rule(x, y, *, out_dtype=None):
    out = getattr(import_torch(), fn_name)(x, y)
    return out if out_dtype is None else out.to(torch_dtype(out_dtype))
  return rule


def _unary(fn_name):
  return lambda x, **_: getattr(import_torch(), fn_name)(x)


RULES = {
    "add": _binary("add"), "sub": _binary("sub"), "mul": _binary("mul"), "div": _divide,
    "max": _binary("maximum"), "min": _binary("minimum"), "pow": _binary("pow"),
    "eq": _binary("eq"), "ne": _binary("ne"), "lt": _binary("lt"), "le": _binary("le"),
    "gt": _binary("gt"), "ge": _binary("ge"), "and": _binary("bitwise_and"),
    "or": _binary("bitwise_or"), "not": _unary("bitwise_not"),
    "neg": _unary("neg"), "exp": _unary("exp"), "exp2": _unary("exp2"), "log": _unary("log"),
    "sqrt": _unary("sqrt"), "rsqrt": _unary("rsqrt"), "abs": _unary("abs"),
    "tanh": _unary("tanh"), "logistic": _unary("sigmoid"),
    "integer_pow": lambda x, *, y: x ** y,
    "reduce_sum": _reduce("sum"), "reduce_max": _reduce("max"), "reduce_min": _reduce("min"),
    "reshape": lambda x, *, new_sizes, **_: x.reshape(new_sizes),
    "broadcast_in_dim": _broadcast_in_dim,
    "transpose": lambda x, *, permutation: x.permute(*permutation),
    "squeeze": lambda x, *, dimensions: x.reshape([d for k, d in enumerate(x.shape)
                                                   if k not in dimensions]),
    "convert_element_type": lambda x, *, new_dtype, **_: x.to(torch_dtype(new_dtype)),
    "pad": _pad, "slice": _slice, "select_n": _select_n, "dot_general": _dot_general,
    "concatenate": lambda *xs, dimension: import_torch().cat(xs, dim=dimension),
    "copy": lambda x: x.clone(), "copy_p": lambda x: x.clone(),
    "optimization_barrier": lambda *xs: xs,   # an XLA scheduling hint: values unchanged
}
MULTIPLE_RESULTS = {"optimization_barrier"}


def to_torch(a, device):
  """A NumPy/JAX array (bfloat16 included) as a torch tensor on ``device``."""
  torch = import_torch()
  a = np.asarray(a)
  if a.dtype == jax.numpy.bfloat16:
    return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16).to(device)
  return torch.from_numpy(a.copy()).to(device)
