"""JAX's own Pallas GPU ops (jax/experimental/pallas/ops/gpu), run on pallax by switching their
two import lines: the compatibility check for kernels written for JAX's Triton path."""
import os
import sys
import types

import jax
import jax.numpy as jnp

IMPORTS = {
    "from jax.experimental import pallas as pl": "import pallax as pl",
    "from jax.experimental.pallas import triton as plgpu": "import pallax.triton as plgpu",
}


def load(name: str) -> types.ModuleType:
  import jax.experimental.pallas.ops.gpu as gpu_ops   # tests may read JAX's Pallas
  path = os.path.join(os.path.dirname(gpu_ops.__file__), name + ".py")
  src = open(path).read()
  for old, new in IMPORTS.items():
    assert old in src, (name, old)
    src = src.replace(old, new)
  mod = types.ModuleType(f"pallax_port_{name}")
  mod.__file__ = path
  sys.modules[mod.__name__] = mod
  exec(compile(src, path, "exec"), mod.__dict__)
  return mod


def _ln_ref(x, w, b, eps=1e-5):
  return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def _rms_ref(x, w, b, eps=1e-5):
  return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * w + b


def cases():
  """(name, module name, function of (module, interpret) -> f(*args), args, reference)."""
  k = jax.random.split(jax.random.key(7), 4)
  x2 = jax.random.normal(k[0], (64, 300))
  x3 = jax.random.normal(k[1], (4, 16, 200))
  w, b = jax.random.normal(k[2], (200,)), jax.random.normal(k[3], (200,))
  q, kk, v = (jax.random.normal(kk_, (1, 256, 2, 64)) for kk_ in jax.random.split(k[0], 3))
  return [
      ("softmax", "softmax", lambda m, i: lambda x: m.softmax(x, axis=-1, interpret=i), (x2,),
       jax.nn.softmax(x2, axis=-1)),
      ("layer_norm", "layer_norm", lambda m, i: lambda x, w, b: m.layer_norm(x, w, b, interpret=i),
       (x3, w, b), _ln_ref(x3, w, b)),
      ("rms_norm", "rms_norm", lambda m, i: lambda x, w, b: m.rms_norm(x, w, b, interpret=i),
       (x3, w, b), _rms_ref(x3, w, b)),
      ("mha", "attention", lambda m, i: lambda q, k, v: m.mha(q, k, v, segment_ids=None, interpret=i),
       (q, kk, v), None),
  ]
