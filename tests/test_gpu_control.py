"""Conditionals written once for both GPU backends (``gpu/control.py``): ``lax.cond`` and
``lax.switch`` of any number of branches, with results or only effects (``pl.when``), in Triton
kernels and in Mosaic GPU kernels (Gluon). Results are checked against numpy in the
interpreter; the suite's conftest compiles every kernel to PTX as well (Triton for sm_75..90,
Gluon for sm_90a). The shape of the generated code is checked through Python's ``ast``."""
import ast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
import pallax.triton as pltriton

from helpers import rand

S = jax.ShapeDtypeStruct
BLOCK = 64
BRANCHES = (lambda x: x * 2.0, lambda x: jnp.exp(x), lambda x: x - 1.0, lambda x: -x)


def _reference(x, n: int):
  """Block i of the output: branch min(i % 4, n - 1) (lax.switch clamps) of block i."""
  blocks = x.reshape(-1, BLOCK)
  return np.concatenate([np.asarray(BRANCHES[min(i % 4, n - 1)](b)) for i, b in enumerate(blocks)])


def _triton_switch(n: int):
  def kernel(x_ref, o_ref):
    i = pl.program_id(0)
    o_ref[...] = lax.switch(i % 4, BRANCHES[:n], x_ref[...])

    @pl.when(i == 1)   # effects only, no else
    def _():
      o_ref[0] = x_ref[1]
  return kernel


def triton_switch(x, n: int, interpret: bool):
  spec = pl.BlockSpec((BLOCK,), lambda i: (i,))
  return pl.pallas_call(_triton_switch(n), out_shape=S(x.shape, x.dtype), grid=(x.shape[0] // BLOCK,),
                        in_specs=[spec], out_specs=spec, interpret=interpret)(x)


def _with_pl_when_row(x, n):
  want = _reference(x, n)
  want[BLOCK] = x[BLOCK + 1]
  return want


def test_triton_switch_of_two_three_and_four_branches():
  x = rand((6 * BLOCK,))
  for n in (2, 3, 4):
    np.testing.assert_allclose(np.asarray(triton_switch(x, n, interpret=True)), _with_pl_when_row(x, n),
                               rtol=1e-6)


def _ifs(source: str) -> list[ast.If]:
  return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.If)]


def _chains(source: str) -> list[int]:
  """The number of branches of each if/elif/else chain (an else counts; an elif is an If alone
  in the orelse of the one before)."""
  ifs = _ifs(source)
  elifs = {id(n.orelse[0]) for n in ifs if len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If)}
  lengths = []
  for n in ifs:
    if id(n) in elifs:
      continue
    k = 1
    while len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If):
      n, k = n.orelse[0], k + 1
    lengths.append(k + bool(n.orelse))
  return sorted(lengths)


def test_triton_conditionals_read_like_hand_written_code():
  x = S((6 * BLOCK,), jnp.float32)
  (k,) = pltriton.lower(lambda x: triton_switch(x, 3, interpret=False), x)
  # The switch: if, elif, else; pl.when: an if without an else (no ``else: pass``).
  assert _chains(k.source) == [1, 3]
  assert not [n for n in _ifs(k.source) for body in (n.body, n.orelse)
              if len(body) == 1 and isinstance(body[0], ast.Pass)]


def _mgpu_switch(n: int):
  def kernel(x_ref, o_ref):
    i = lax.axis_index("m")
    block = pl.ds(i * BLOCK, BLOCK)
    o_ref[block] = lax.switch(i % 4, BRANCHES[:n], x_ref[block])
  return kernel


def mgpu_switch(x, n: int, interpret: bool):
  return plgpu.kernel(_mgpu_switch(n), out_type=S(x.shape, x.dtype), grid=(x.shape[0] // BLOCK,),
                      grid_names=("m",), interpret=interpret)(x)


def test_mosaic_gpu_switch_of_two_three_and_four_branches():
  x = rand((6 * BLOCK,))
  for n in (2, 3, 4):
    np.testing.assert_allclose(np.asarray(mgpu_switch(x, n, interpret=True)), _reference(x, n),
                               rtol=1e-6)


def test_mosaic_gpu_switch_lowers_to_one_if_chain():
  (k,) = plgpu.lower(lambda x: mgpu_switch(x, 4, interpret=False), S((6 * BLOCK,), jnp.float32))
  assert _chains(k.source) == [4]   # if, elif, elif, else
