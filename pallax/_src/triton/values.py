"""What the code generator tracks for each jaxpr value: arrays and Refs as Triton expressions."""
from __future__ import annotations

import dataclasses
import math
import re

import jax.numpy as jnp
import numpy as np


def pow2(n: int) -> int:
  return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


TL_DTYPES = {
    "float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
    "float64": "tl.float64", "float8_e4m3fn": "tl.float8e4nv", "float8_e5m2": "tl.float8e5",
    "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32", "int64": "tl.int64",
    "uint8": "tl.uint8", "uint16": "tl.uint16", "uint32": "tl.uint32", "uint64": "tl.uint64",
    "bool": "tl.int1",
}

SIGNATURE = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "int8": "i8", "int16": "i16",
    "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32",
    "uint64": "u64", "bool": "i1",
}


NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?")   # a Python int or float literal
_NAMED = {"True": True, "False": False, "INF": math.inf, "-INF": -math.inf, "NAN": math.nan}


def literal(v):
  """The Python number a scalar literal Val stands for (None if it is not one)."""
  if v.shape != ():
    return None
  if v.expr in _NAMED:
    return _NAMED[v.expr]
  if NUMBER.fullmatch(v.expr):
    return int(v.expr) if re.fullmatch(r"-?\d+", v.expr) else float(v.expr)
  return None


def tl_dtype(dtype) -> str:
  name = jnp.dtype(dtype).name
  if name not in TL_DTYPES:
    raise NotImplementedError(f"dtype {name} is not supported by the Triton backend")
  return TL_DTYPES[name]


@dataclasses.dataclass
class Val:
  """An array value: a Triton expression whose tensor has the padded shape."""
  expr: str
  shape: tuple[int, ...]
  dtype: np.dtype

  @property
  def padded(self) -> tuple[int, ...]:
    return tuple(pow2(d) for d in self.shape)

  @property
  def is_padded(self) -> bool:
    return self.padded != tuple(self.shape)


@dataclasses.dataclass
class RefDim:
  """One dimension of the array behind a Ref view: global coordinate = start + step * local."""
  start: str          # element offset of local coordinate 0 (an int expression)
  size: int           # extent of the view (1 when the dimension is indexed away)
  array_size: int
  stride: int         # elements between neighbours in the array
  step: int = 1
  kept: bool = True   # a dimension of the view (False: squeezed or integer-indexed)
  exact: bool = True  # every local coordinate < size lies inside the array
  index: str | None = None  # a tensor of offsets: global = start + step * index[local]
  index_rank: int = 1       # the index tensor's rank (> 1 when several arrays index the view)
  index_axis: int = 0       # this dimension's axis in the index tensor
  low: bool = False         # start may be negative (an Element block with low padding)


@dataclasses.dataclass
class RefVal:
  ptr: str
  dtype: np.dtype
  dims: list[RefDim]
  origin: str

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(d.size for d in self.dims if d.kept)
