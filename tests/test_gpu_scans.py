"""``lax.scan`` over arrays in Mosaic GPU kernels on the Gluon backend (``gpu/scans.py``: a loop
over the rows of shared-memory scratch): the kernels lower to Gluon and agree with the interpreter
and numpy (partial tiles, one row, scalar rows); on a Hopper GPU the Gluon kernels run and are
compared with the interpreter. (Triton's own loop is covered by the corpus kernel
``scan_over_arrays``.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax.mosaic_gpu as plgpu
import pallax as pl
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import primitives as prims
from pallax._src.gpu.scans import scans_over_scratch


def _recurrence(x_ref, w_ref, o_ref, s_ref):
  """Rows of x and w scanned with a carried row; a row and a scalar out per step; a reversed
  scan over one column (scalar rows) whose ys are the running sums before each step."""
  def step(h, xw):
    x, w = xw
    h = jnp.tanh(h * w + x)
    return h, (h * 3 - 1, jnp.max(h))
  h, (ys, peaks) = lax.scan(step, jnp.zeros((x_ref.shape[1],), jnp.float32), (x_ref[...], w_ref[...]))
  _, before = lax.scan(lambda c, v: (c + v, c), jnp.float32(0), x_ref[:, 0], reverse=True)
  o_ref[...] = ys + h
  s_ref[...] = peaks + before


def recurrence(x, w, interpret=False):
  rows, cols = x.shape
  return plgpu.kernel(_recurrence, out_type=(jax.ShapeDtypeStruct((rows, cols), jnp.float32),
                                             jax.ShapeDtypeStruct((rows,), jnp.float32)),
                      interpret=interpret)(x, w)


def _numpy_recurrence(x, w):
  h = np.zeros(x.shape[1], np.float32)
  ys, peaks = [], []
  for xr, wr in zip(x, w):
    h = np.tanh(h * wr + xr)
    ys.append(h * 3 - 1)
    peaks.append(h.max())
  col = x[:, 0]
  before = np.array([col[k + 1:].sum() for k in range(len(col))], np.float32)
  return np.stack(ys) + h, np.array(peaks) + before


SHAPES = [(8, 32), (12, 16), (1, 64), (5, 24)]   # powers of two, not, one row


def _inputs(shape, seed):
  kx, kw = jax.random.split(jax.random.key(seed))
  return jax.random.normal(kx, shape, jnp.float32), jax.random.normal(kw, shape, jnp.float32)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_interpreter_matches_numpy(shape):
  x, w = _inputs(shape, 1)
  got = recurrence(x, w, interpret=True)
  for g, want in zip(got, _numpy_recurrence(np.asarray(x), np.asarray(w))):
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_lowers_to_gluon(shape):
  s = jax.ShapeDtypeStruct(shape, jnp.float32)
  (k,) = plgpu.lower(recurrence, s, s)
  assert "ld.shared" in k.ptx and "st.shared" in k.ptx


def test_the_rewrite_leaves_no_scan_over_arrays():
  def fn(xs, c):
    def step(c, x):
      return c + x.sum(), x * c
    return lax.scan(step, c, xs, reverse=True)

  x = jnp.arange(12, dtype=jnp.float32).reshape(4, 3)
  jaxpr = jax.make_jaxpr(fn)(x, jnp.float32(1))
  new = scans_over_scratch(jaxpr, pl.ANY)
  scans = [e for e in jaxpr_util.equations(new.jaxpr) if e.primitive is ji.scan_p]
  assert scans and all(not e.params["ft_in"].unpack()[2] and len(e.outvars) == len(
      e.params["ft_in"].unpack()[1]) for e in scans)
  assert jaxpr_util.uses(new.jaxpr, {prims.run_scoped_p})


def _on_hopper() -> bool:
  d = jax.devices()[0]
  return d.platform == "gpu" and float(getattr(d, "compute_capability", "0")) >= 9.0


@pytest.mark.gpu
@pytest.mark.skipif(not _on_hopper(), reason="needs a Hopper GPU")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_on_the_gpu_matches_the_interpreter(shape):
  x, w = _inputs(shape, 2)
  got = jax.jit(recurrence)(x, w)
  want = recurrence(x, w, interpret=True)
  for g, v in zip(got, want):   # tanh on the GPU: XLA's function, within a few ulps of the host's
    np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=1e-5, atol=1e-5)
