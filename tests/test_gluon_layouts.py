"""The Gluon backend's layout assignment (``gluon/assign.py``), checked through the data it
records: loop carries that start as constants take the layout their loop computes them in,
SMEM buffers get the layout rank their views need, and ``debug=True`` reports the conversions
the assignment found. Each kernel's results are also compared with NumPy in the interpreter."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import events as ev
from pallax._src.gluon import layouts as L

from helpers import unused_definitions

S = jax.ShapeDtypeStruct


def _line_of(marker: str) -> str:
  """'file:line' of the line of this file that holds ``marker``."""
  with open(__file__) as f:
    (n,) = [k + 1 for k, line in enumerate(f) if line.rstrip().endswith(marker)]
  return f"{__file__}:{n}"


def _row_max_loop(a_ref, b_ref, o_ref, a_smem, b_smem, bar, steps):
  """A running row max of ``steps`` products a @ (b * (k + 1)): the carry starts as a splat."""
  plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
  plgpu.copy_gmem_to_smem(b_ref, b_smem, bar)
  plgpu.barrier_wait(bar)

  def body(k, m):
    def product(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)
    s = pl.run_state(product)(plgpu.ACC.init(jnp.zeros(o_ref.shape + (b_smem.shape[1],), jnp.float32)))
    return jnp.maximum(m, jnp.max(s * (k + 1).astype(jnp.float32), axis=1))

  o_ref[...] = lax.fori_loop(0, steps, body, jnp.full(o_ref.shape, -jnp.inf, jnp.float32))   # <- store


def row_max_loop(a, b, steps=3, interpret=False, debug=False):
  return plgpu.kernel(
      functools.partial(_row_max_loop, steps=steps), out_shape=S((a.shape[0],), jnp.float32),
      scratch_shapes=[plgpu.SMEM(a.shape, a.dtype), plgpu.SMEM(b.shape, b.dtype),
                      plgpu.Barrier(num_arrivals=2)], interpret=interpret, debug=debug)(a, b)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_a_carry_that_starts_as_a_splat_takes_the_layout_of_the_loop(dtype):
  ka, kb = jax.random.split(jax.random.key(11))
  a = jax.random.normal(ka, (64, 32), dtype)
  b = jax.random.normal(kb, (32, 48), dtype)   # N = 48: a wgmma tile padded to 64 columns
  s = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  want = np.max(np.stack([s * (k + 1) for k in range(3)]), axis=(0, 2))
  np.testing.assert_allclose(np.asarray(row_max_loop(a, b, interpret=True)), want, rtol=1e-5, atol=1e-5)
  (k,) = plgpu.lower(row_max_loop, S(a.shape, dtype), S(b.shape, dtype))
  # The row max of a wgmma accumulator is a slice of its layout; the carry starts in that layout
  # (the splat is written in it), so nothing converts inside the loop: the one conversion is
  # the result's, to the coalesced layout of the store after the loop.
  row = L.Slice(1, L.wgmma(48, 16))
  (conversion,) = k.generated.conversions
  assert (conversion.source, conversion.target.kind, conversion.shape) == (row, "blocked", (64,))
  assert conversion.frame.startswith(f"{_line_of('# <- store')} ")
  # Splats written again in the layouts their uses need are not also written in their own; the
  # loop's next index and unused layouts are not written either.
  assert unused_definitions(k.source) == []


def test_debug_reports_the_conversions_the_assignment_found(capsys):
  a, b = S((64, 32), jnp.float16), S((32, 48), jnp.float16)
  (k,) = plgpu.lower(functools.partial(row_max_loop, debug=True), a, b)
  report = capsys.readouterr().out
  assert report.count("convert_layout") == len(k.generated.conversions) == 1
  assert all(f"= {x.text(lambda p: '')}".split("(")[0] in report for x in k.generated.layouts
             if not isinstance(x, (L.Slice, L.DotOperand)))


def _stacked(x_ref, o_ref, t_ref, smem, bar):
  """A (2, rows, cols) buffer copied in and out whole (TMA boxes of rank 3), its two slots read
  by registers through ``.at[i]`` (rank 2), and read and written whole by registers (rank 3)."""
  plgpu.copy_gmem_to_smem(x_ref, smem, bar)
  plgpu.barrier_wait(bar)
  o_ref[...] = smem[0] * 2 + smem[1]
  smem[...] = smem[...] + 1
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(smem, t_ref)
  plgpu.wait_smem_to_gmem(0)


def stacked(x, interpret=False):
  return plgpu.kernel(_stacked, out_shape=(S(x.shape[1:], x.dtype), S(x.shape, x.dtype)),
                      scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()],
                      interpret=interpret)(x)


# Registers reading the whole buffer at once see it through a layout of rank 3, which orders
# rows wider than the swizzle (48 float32, padded to 256 bytes) otherwise than its rank-2 layout.
_WIDE = pytest.mark.gluon_refuses("rows wider than its 128-byte swizzle")


@pytest.mark.parametrize("dtype,rows,cols", [
    (jnp.float32, 64, 32), (jnp.float16, 64, 32), (jnp.float16, 24, 48),
    pytest.param(jnp.float32, 24, 48, marks=_WIDE)],
    ids=["powers_of_two-float32", "powers_of_two-float16", "padded-float16", "padded-float32"])
def test_an_smem_buffer_takes_the_rank_of_its_views(dtype, rows, cols):
  x = jax.random.normal(jax.random.key(rows + cols), (2, rows, cols), dtype)
  o, t = stacked(x, interpret=True)
  if 4 * cols > 128 and dtype == jnp.float32:
    with pytest.raises(NotImplementedError, match=r"registers reading or writing a whole SMEM buffer"):
      plgpu.lower(stacked, S(x.shape, dtype))
    return
  xs = np.asarray(x, np.float32)
  np.testing.assert_allclose(np.asarray(o, np.float32), (xs[0] * 2 + xs[1]).astype(dtype).astype(np.float32),
                             rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(np.asarray(t, np.float32), (xs + 1).astype(dtype).astype(np.float32),
                             rtol=1e-3, atol=1e-3)
  (k,) = plgpu.lower(stacked, S(x.shape, dtype))
  (buffer,) = k.generated.buffers
  # Views of ranks 2 (a slot) and 3 (the whole buffer): the buffer's layout has rank 2, its
  # leading dimension only indexed; the dimensions the layout describes are padded.
  assert (buffer.ranks, buffer.registers, buffer.rank) == ({2, 3}, {2}, 2)
  assert buffer.stored == (2, 1 << (rows - 1).bit_length(), 1 << (cols - 1).bit_length())
  assert buffer.layout == L.shared((2, rows, cols), dtype, 2)
  smem = [(e.kind, e.ref.steps[:1], e.shape) for e in k.generated.partitions[0].events
          if isinstance(e, ev.Access) and isinstance(e.ref, ev.SmemView)]
  slot = lambda i: (("index", i),)
  assert [(kind, steps and steps[0][1].value, shape) for kind, steps, shape in smem] == [
      ("load", 0, (rows, cols)), ("load", 1, (rows, cols)), ("load", (), (2, rows, cols)),
      ("store", (), (2, rows, cols))]


def test_views_no_one_layout_serves_are_refused():
  def kernel(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[0, 0] + smem[1, 1]   # rank 1 views of a rank 3 buffer
  x = S((2, 2, 64), jnp.float32)
  f = plgpu.kernel(kernel, out_shape=S((64,), jnp.float32),
                   scratch_shapes=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()])
  with pytest.raises(NotImplementedError, match=r"SMEM views of ranks \[1, 3\].*interpret=True"):
    plgpu.lower(f, x)
