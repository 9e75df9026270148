"""A slice of the columns of a swizzled SMEM matrix from a start known only at run time
(``smem.at[:, pl.ds(start, w)]``, ``w`` the swizzle's width in elements). Mosaic GPU takes it
when the start is provably a multiple of ``w`` (whole swizzle chunks) and refuses it at compile
time otherwise; pallax's Gluon backend does the same, the proof being the start's arithmetic
(``i * w``) or the user's ``pl.multiple_of(start, w)``. Rows wider than the swizzle are stored
as column chunks one after another, so the slice is the chunk the start is in.

Checked in the interpreter against NumPy (exact: a copy), the view the Gluon backend records
(``events``: a ``("columns", start, w)`` step), the refusal, and on a GPU the Gluon kernel
against the interpreter (conftest.py) for each start and dtype."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
import pallax.mosaic_gpu as plgpu
from helpers import rand_seeded as rand
from pallax._src.gluon import events as ev

pytestmark = pytest.mark.interpreter

S = jax.ShapeDtypeStruct


def column_chunk(rows, cols, dtype, how):
  """Copies x (rows, cols) into SMEM by TMA, then reads the chunk of columns at a run-time start
  (``how``: "times", start = chunk * w; "hint", start = pl.multiple_of(start, w); "plain", the
  start as it is) through registers into the output."""
  width = 128 // np.dtype(dtype).itemsize   # the 128-byte swizzle's width

  def body(x_ref, chunk_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    chunk = chunk_ref[0]
    start = {"times": lambda: chunk * width, "hint": lambda: pl.multiple_of(chunk, width),
             "plain": lambda: chunk}[how]()
    o_ref[...] = smem.at[:, pl.ds(start, width)][...] + 1

  return plgpu.kernel(body, out_shape=S((rows, width), dtype),
                      scratch_shapes=[plgpu.SMEM((rows, cols), dtype), plgpu.Barrier(num_arrivals=1)])


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.float16])
@pytest.mark.parametrize("rows,cols", [(64, 64), (8, 256), (128, 256)])
def test_a_run_time_chunk_of_columns_is_read(dtype, rows, cols):
  width = 128 // np.dtype(dtype).itemsize
  if cols <= width:
    cols = 2 * width
  x = rand(1, (rows, cols), dtype)
  kernel = column_chunk(rows, cols, dtype, "times")
  for chunk in range(cols // width):
    got = kernel(x, np.array([chunk], np.int32))
    np.testing.assert_array_equal(got, x[:, chunk * width:(chunk + 1) * width] + 1)


def test_a_start_the_user_says_is_a_multiple_is_read():
  x = rand(2, (64, 64), jnp.int32)
  got = column_chunk(64, 64, jnp.int32, "hint")(x, np.array([32], np.int32))
  np.testing.assert_array_equal(got, x[:, 32:] + 1)


def test_the_view_is_the_chunk_of_the_start():
  (k,) = plgpu.lower(column_chunk(64, 64, jnp.int32, "times"), S((64, 64), jnp.int32),
                     S((1,), jnp.int32))
  loads = [e for e in k.generated.partitions[0].events
           if isinstance(e, ev.Access) and isinstance(e.ref, ev.SmemView)]
  ((kind, start, size),) = [s for e in loads for s in e.ref.steps]
  assert (kind, size) == ("columns", 32)


def test_a_start_not_known_to_be_a_multiple_is_refused_at_compile_time():
  with pytest.raises(ValueError, match=r"Failed to infer a possible set of layouts.*pl.multiple_of"):
    plgpu.lower(column_chunk(64, 64, jnp.int32, "plain"), S((64, 64), jnp.int32), S((1,), jnp.int32))
