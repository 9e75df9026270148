"""TMA boxes whose rows are not a power of two wide, over arrays they do not span (a 192-column
block of a wider matrix, as JAX's ragged dot loads its rhs), or longer than one TMA box (512):
Gluon pads SMEM tiles to powers of two, so the box is copied in pieces whose widths are powers of
two (128 + 64; 256 + 256), each starting on a swizzle atom, never reaching into the next block's
columns. Run by default (the interpreter on
a CPU, where the kernel is also lowered to Gluon PTX; the Gluon backend on a Hopper GPU) and
compared with numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu
from pallax._src.gluon import events as ev


def _smem(shape, dtype, swizzle):
  if not swizzle:
    return plgpu.SMEM(shape, dtype)
  elems = swizzle // jnp.dtype(dtype).itemsize
  return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, elems)),
                                              plgpu.SwizzleTransform(swizzle)))


def _column_blocks(x, width, swizzle):
  """Each program copies one ``width``-column block of ``x`` in by TMA, adds 1 in registers,
  and copies it out by TMA to the same block of the output."""
  rows, cols = x.shape

  def body(x_ref, o_ref, smem, bar):
    j = lax.axis_index("j")
    block = pl.ds(j * width, width)
    plgpu.copy_gmem_to_smem(x_ref.at[:, block], smem, bar)
    plgpu.barrier_wait(bar)
    smem[...] = smem[...] + 1
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[:, block])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(cols // width,),
                      grid_names=("j",), scratch_types=[_smem((rows, width), x.dtype, swizzle),
                                                        plgpu.Barrier()])


CASES = [  # (rows, width, blocks, dtype, swizzle)
    (64, 192, 3, jnp.bfloat16, 128),   # 128 + 64 columns
    (32, 96, 2, jnp.float32, 0),       # 64 + 32 (the buffer's own layout swizzles 128 bytes)
    (8, 192, 2, jnp.float32, 0),       # 128 + 64 float32
    (16, 512, 2, jnp.bfloat16, 128),   # 256 + 256: rows longer than one TMA box
    (8, 384, 2, jnp.bfloat16, 128),    # 256 + 128
]


@pytest.mark.parametrize("rows,width,blocks,dtype,swizzle", CASES, ids=str)
def test_column_blocks_copied_in_pieces(rows, width, blocks, dtype, swizzle):
  x = jax.random.normal(jax.random.key(width), (rows, width * blocks), dtype)
  got = _column_blocks(x, width, swizzle)(x)
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(x + 1, np.float32))


@pytest.mark.parametrize("rows,width,blocks,dtype,swizzle", CASES, ids=str)
def test_each_piece_is_a_power_of_two_inside_the_block(rows, width, blocks, dtype, swizzle):
  s = jax.ShapeDtypeStruct((rows, width * blocks), dtype)
  (k,) = plgpu.lower(_column_blocks(s, width, swizzle), s)
  copies = [e for e in k.generated.partitions[0].events if isinstance(e, ev.Copy)]
  for direction in ("in", "out"):
    widths = [c.box[-1] for c in copies if c.direction == direction]
    assert sum(widths) == width and all(w & (w - 1) == 0 for w in widths) and len(widths) > 1


@pytest.mark.interpreter
@pytest.mark.gluon_refuses("would reach into the next block")
def test_pieces_narrower_than_the_swizzle_are_refused():
  # 48 float32 columns: 32 + 16, and 16 float32 (64 bytes) are narrower than the 128-byte
  # swizzle Gluon gives the buffer. The interpreter runs it.
  x = jax.random.normal(jax.random.key(1), (32, 144), jnp.float32)
  got = _column_blocks(x, 48, 0)(x)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(x + 1))


def _matmul_192(a, b, swizzle=128):
  """A (64, 64) @ (64, 192) block product, b's block taken from a wider array by TMA."""
  def body(a_ref, b_ref, o_ref, a_smem, b_smem, bar):
    j = lax.axis_index("j")
    plgpu.copy_gmem_to_smem(a_ref, a_smem, bar)
    plgpu.copy_gmem_to_smem(b_ref.at[:, pl.ds(j * 192, 192)], b_smem, bar)
    plgpu.barrier_wait(bar)

    def scope(acc):
      plgpu.wgmma(acc, a_smem, b_smem)
      plgpu.wgmma_wait(0)
      o_ref[:, pl.ds(j * 192, 192)] = acc[...]
    pl.run_scoped(scope, plgpu.ACC((64, 192)))

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, b.shape[1]), jnp.float32),
                      grid=(b.shape[1] // 192,), grid_names=("j",),
                      scratch_types=[_smem((64, 64), a.dtype, swizzle), _smem((64, 192), b.dtype, swizzle),
                                     plgpu.Barrier(num_arrivals=2)])(a, b)


def test_wgmma_of_a_192_column_block():
  ka, kb = jax.random.split(jax.random.key(7))
  a = jax.random.normal(ka, (64, 64), jnp.bfloat16)
  b = jax.random.normal(kb, (64, 384), jnp.bfloat16)
  want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  got = np.asarray(_matmul_192(a, b))
  # wgmma sums bf16 products in float32 in its own order: relative to the output's scale.
  np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * float(np.abs(want).max()))
