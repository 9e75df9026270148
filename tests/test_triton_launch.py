"""How compiled Triton kernels are launched inside XLA (pallax/_src/triton/launch.py).

On any machine: a kernel lowered for CUDA (sm_90, the GPU faked) becomes one XLA kernel call
whose operands and results fill exactly the parameters Triton declared, in Triton's order, with
row-major layouts, and zero-filled hidden buffers aliased in. On a GPU: the default launch
(XLA's kernel call) and jaxlib's Triton call agree, and a zeroed buffer is zero on every call.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallax as pl
from pallax._src import jax_internals as ji
from pallax._src.triton import launch

S = jax.ShapeDtypeStruct


def _add(x_ref, y_ref, o_ref):
  o_ref[...] = x_ref[...] + y_ref[...] * 2


def add(x, y):
  return pl.pallas_call(_add, out_shape=S(x.shape, x.dtype), grid=(2,),
                        in_specs=[pl.BlockSpec((4, 8), lambda i: (i, 0))] * 2,
                        out_specs=pl.BlockSpec((4, 8), lambda i: (i, 0)))(x, y)


def add_into_y(x, y):   # y's buffer becomes the output
  return pl.pallas_call(_add, out_shape=S(x.shape, x.dtype), input_output_aliases={1: 0})(x, y)


def add_to_itself(x, _):   # one array passed twice: two kernel parameters, one buffer
  return add(x, x)


def _global(x_ref, o_ref):
  g = pl.get_global(pl.ANY((16,), jnp.float32))   # zero at the start of every call
  o_ref[...] = x_ref[...] + g[...]
  g[...] = x_ref[...]


def with_global(x, _):
  return pl.pallas_call(_global, out_shape=S((16,), jnp.float32))(x.reshape(-1)[:16])


def _iota(o_ref):
  o_ref[...] = jax.lax.broadcasted_iota(jnp.float32, o_ref.shape, 0)


def no_operands(x, _):
  return pl.pallas_call(_iota, out_shape=S((8, 8), jnp.float32))()


KERNELS = [add, add_into_y, add_to_itself, with_global, no_operands]


def _ptx_call(fn, monkeypatch):
  """The XLA kernel call of ``fn``'s one pallas_call, lowered for CUDA on this machine."""
  monkeypatch.setattr(launch, "device_compute_capability", lambda: 90)
  monkeypatch.setenv("PALLAX_TRITON_LAUNCH", "xla")
  x = S((8, 8), jnp.float32)
  module = jax.jit(fn).trace(x, x).lower(lowering_platforms=("cuda",)).compiler_ir("stablehlo")
  calls = []
  def visit(op):
    if op.operation.name == "stablehlo.custom_call":
      calls.append(op.operation)
    return ji.ir.WalkResult.ADVANCE
  module.operation.walk(visit)
  (call,) = calls
  return call


def _entry_params(ptx: str) -> int:
  entry = re.search(r"\.entry\s+\w+\s*\(([^)]*)\)", ptx).group(1)
  return len(re.findall(r"\.param\b", entry))


@pytest.mark.parametrize("fn", KERNELS, ids=lambda f: f.__name__)
def test_the_call_fills_every_kernel_parameter(fn, monkeypatch):
  call = _ptx_call(fn, monkeypatch)
  assert ji.ir.StringAttr(call.attributes["call_target_name"]).value == "__gpu$xla.gpu.ptx"
  text = ji.ir.StringAttr(call.attributes["backend_config"]).value
  config = ji.ir.DictAttr(ji.ir.Attribute.parse(text, context=call.context))
  outputs = [ji.ir.IntegerAttr(a).value for a in ji.ir.ArrayAttr(config["output_indices"])]
  ptx = ji.ir.StringAttr(config["kernel_data"]).value
  aliases = str(call.attributes["output_operand_aliases"]) if "output_operand_aliases" in call.attributes else ""
  zero_filled = aliases.count("operand_index") - (fn is add_into_y)
  # XLA places the results at output_indices and the operands in the other slots, in order; the
  # zero-filled operands go past the kernel's last parameter.
  assert len(outputs) == len(call.results)
  assert outputs == list(range(outputs[0], outputs[0] + len(outputs)))
  assert _entry_params(ptx) == len(call.operands) + len(call.results) - zero_filled
  assert (fn is with_global) == (zero_filled == 1)
  # Triton's two scratch pointers are the last two parameters, filled by operands.
  assert outputs[-1] == _entry_params(ptx) - 3
  for layouts in ("operand_layouts", "result_layouts"):
    for layout in ji.ir.ArrayAttr(call.attributes[layouts]):
      dims = list(np.asarray(ji.ir.DenseIntElementsAttr(layout)))
      assert dims == sorted(dims, reverse=True), f"{layouts}: not row-major: {dims}"


def test_an_unknown_launch_path_is_a_clear_error(monkeypatch):
  monkeypatch.setenv("PALLAX_TRITON_LAUNCH", "cuda_graph")
  with pytest.raises(ValueError, match="PALLAX_TRITON_LAUNCH='cuda_graph': expected one of xla, ffi"):
    launch.launch_path()


# --- on a GPU --------------------------------------------------------------------------------

def _on_gpu():
  return jax.devices()[0].platform == "gpu"


@pytest.mark.gpu
@pytest.mark.skipif(not _on_gpu(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("fn", KERNELS, ids=lambda f: f.__name__)
def test_both_launch_paths_give_the_same_results(fn, monkeypatch):
  x = jax.random.normal(jax.random.key(1), (8, 8))
  y = jax.random.normal(jax.random.key(2), (8, 8))
  got = {}
  for path in launch.LAUNCH_PATHS:
    monkeypatch.setenv("PALLAX_TRITON_LAUNCH", path)
    f = jax.jit(lambda a, b: fn(a, b))   # a fresh jit: lowered again with this path
    got[path] = [np.asarray(f(x, y)) for _ in range(3)]   # zeroed buffers: zero on every call
  want = {add: x + 2 * y, add_into_y: x + 2 * y, add_to_itself: 3 * x, with_global: x.reshape(-1)[:16],
          no_operands: np.broadcast_to(np.arange(8.0)[:, None], (8, 8))}[fn]
  for path, outs in got.items():
    for out in outs:
      np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=path)
