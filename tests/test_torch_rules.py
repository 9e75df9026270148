"""The lax primitives ``as_torch_kernel`` runs as torch operations (``pallax/_src/torch/rules.py``),
each against JAX on the CPU, elementwise, on random inputs (skipped where torch is missing)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from pallax._src.torch import plan as torch_plan  # noqa: E402
from pallax._src.torch import rules as torch_rules  # noqa: E402

rng = np.random.default_rng(0)
F = rng.standard_normal((6, 10)).astype(np.float32)
G = rng.standard_normal((6, 10)).astype(np.float32)
P = np.abs(F) + 0.5                                      # positive, for log/sqrt/rsqrt/pow
I = rng.integers(-50, 50, (6, 10)).astype(np.int32)
J = rng.integers(1, 7, (6, 10)).astype(np.int32) * rng.choice([-1, 1], (6, 10)).astype(np.int32)

CASES = {
    "add sub mul div": (lambda x, y: (x + y) * (x - y) / (y + 3.0), (F, G)),
    "max min neg abs": (lambda x, y: jnp.maximum(x, y) - jnp.minimum(-x, jnp.abs(y)), (F, G)),
    "exp exp2 log": (lambda x: jnp.exp(x) + jnp.exp2(x) + jnp.log(x), (P,)),
    "sqrt rsqrt pow": (lambda x, y: jnp.sqrt(x) + lax.rsqrt(x) + x ** y, (P, G)),
    "tanh logistic": (lambda x: jnp.tanh(x) + jax.nn.sigmoid(x), (F,)),
    "integer_pow": (lambda x: x ** 3 + x ** 2, (F,)),
    "integer division truncates": (lambda i, j: lax.div(i, j), (I, J)),
    "comparisons and logic": (lambda x, y: ((x > y) & ~(x < 0.5)) | (x == y) | (x >= 1.0)
                              | (x <= -1.0) | (x != x), (F, G)),
    "select_n (where)": (lambda x, y: jnp.where(x > 0, x, y), (F, G)),
    "reductions": (lambda x: (jnp.sum(x, axis=1), jnp.max(x, axis=0), jnp.min(x, axis=(0, 1))),
                   (F,)),
    "reshape transpose squeeze": (lambda x: (x.reshape(3, 20), x.T, x[None].squeeze(0)), (F,)),
    "broadcast_in_dim": (lambda x: jnp.broadcast_to(x[:, None, :], (6, 4, 10)), (F,)),
    "convert_element_type": (lambda x: (x.astype(jnp.bfloat16), x.astype(jnp.int32),
                                        x.astype(jnp.float16)), (F * 10,)),
    "pad": (lambda x: jnp.pad(x, ((1, 2), (0, 3)), constant_values=1.5), (F,)),
    "slice": (lambda x: x[1:5, 2:9:3], (F,)),
    "concatenate": (lambda x, y: jnp.concatenate([x, y], axis=1), (F, G)),
    "optimization_barrier": (lambda x, y: lax.optimization_barrier((x, y)), (F, G)),
    "dot_general (batch and contracting dimensions)": (
        lambda x, y: (x @ y.T, jnp.einsum("bqhd,bqhd->bhq", x.reshape(2, 3, 5, 2),
                                           y.reshape(2, 3, 5, 2)),
                      lax.dot_general(x.astype(jnp.bfloat16), y.astype(jnp.bfloat16),
                                      (((1,), (1,)), ((), ())),
                                      preferred_element_type=jnp.float32)), (F, G)),
    "captured constant, inner jit": (lambda x: jax.jit(lambda a: a * 2)(x) + np.arange(
        10, dtype=np.float32), (F,)),
}


def _torch_eval(fn, args):
  """``fn`` traced to a jaxpr and run by as_torch_kernel's prepared plan on CPU tensors."""
  closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
  plan = torch_plan.Plan(closed, torch.device("cpu"), "test")
  outs = plan.run([torch.from_numpy(a.copy()) for a in args])
  return jax.tree.unflatten(jax.tree.structure(out_shape), outs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_matches_lax(name):
  fn, args = CASES[name]
  with jax.default_device(jax.devices("cpu")[0]):   # a GPU's default f32 dot would be TF32
    want = jax.tree.leaves(jax.jit(fn)(*args))
  got = jax.tree.leaves(_torch_eval(fn, args))
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert tuple(g.shape) == w.shape, name
    assert g.dtype == torch_rules.torch_dtype(w.dtype), (name, g.dtype, w.dtype)
    g = g.float().numpy() if g.dtype == torch.bfloat16 else g.numpy()
    w = np.asarray(w.astype(np.float32) if w.dtype == jnp.bfloat16 else w)
    if np.issubdtype(w.dtype, np.floating):
      np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-6, err_msg=name)
    else:
      np.testing.assert_array_equal(g, w, err_msg=name)


def test_a_primitive_without_a_rule_names_itself():
  closed = jax.make_jaxpr(lambda x: jnp.sort(x))(jax.ShapeDtypeStruct((8,), jnp.float32))
  with pytest.raises(NotImplementedError, match=r"sort \(at .*test_torch_rules.py.*\) has no torch "
                                                r"equivalent in pallax"):
    torch_plan.Plan(closed, torch.device("cpu"), "test")
