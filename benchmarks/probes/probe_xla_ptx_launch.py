"""Probe: launch pallax's compiled softmax through XLA's own PTX kernel call (``__gpu$xla.gpu.ptx``,
an XLA-internal custom call) instead of jaxlib's ``triton_kernel_call_ffi``, and compare the wall
clock per call (which includes launch overheads) with JAX Pallas. Simple kernels only (no
scratch outputs, no aliasing). A research probe: it patches pallax internals.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_xla_ptx_launch.py
"""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax, jax.numpy as jnp
import triton_vs_pallas as tvp
import timing
import pallax, pallax.triton as plt_
from pallax._src import jax_internals as ji
from pallax._src.triton import launch, codegen  # noqa: E402
from pallax._src.triton.compile import compile_kernel
from jax.experimental.pallas import triton as jplt
JP = tvp.jax_pallas()

def mlir_str(s):
  safe = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:_-+*/()[]{}<>%$@!=&|^~#'?")
  return '"' + "".join(chr(b) if b in safe else f"\\{b:02X}" for b in s.encode()) + '"'

def ptx_lowering(ctx, *args, params):
  cc = launch.device_compute_capability()
  ks = codegen.generate(params, cc)
  c = compile_kernel(ks, cc, params.name)
  assert not c.hidden and not params.input_output_aliases, "probe: simple kernels only"
  n_in, n_out = len(args), len(ctx.avals_out)
  gx, gy, gz = c.grid
  cfg = (f"{{name = {mlir_str(c.name)}, kernel_type = \"ptx\", kernel_data = {mlir_str(c.ptx)}, "
         f"grid_x = {gx} : i32, grid_y = {gy} : i32, grid_z = {gz} : i32, block_x = {32 * c.num_warps} : i32, "
         f"block_y = 1 : i32, block_z = 1 : i32, shared_mem_bytes = {c.shared_mem_bytes} : i32, "
         f"output_indices = [{', '.join(f'{n_in + i} : i32' for i in range(n_out))}]}}")
  dummy = args[0]
  op = ji.mlir.custom_call("__gpu$xla.gpu.ptx", result_types=[ji.mlir.aval_to_ir_type(a) for a in ctx.avals_out],
                           operands=[*args, dummy, dummy], backend_config=cfg, api_version=1)
  return op.results

def softmax_fn(mode):
  def f(a):
    old = launch.triton_lowering
    if mode == "ptx":
      launch.triton_lowering = ptx_lowering
    try:
      return tvp.softmax(pallax, plt_.CompilerParams, a)
    finally:
      launch.triton_lowering = old
  return jax.jit(f)

for shape in ((8, 8192), (1000, 1024), (16384, 8192)):
  x = jax.random.normal(jax.random.key(int(time.time())), shape, jnp.float32)
  ref = jax.nn.softmax(x, axis=1)
  fns = {"pallax_ffi": softmax_fn("ffi"), "pallax_ptx": softmax_fn("ptx"),
         "jax_pallas": jax.jit(lambda a: tvp.softmax(JP, jplt.CompilerParams, a))}
  for k, f in fns.items():
    print(shape, k, "err", f"{timing.rel_err(f(x), ref):.2e}", flush=True)
  if shape == (16384, 8192):
    print(fns["pallax_ptx"].lower(x).compile().as_text()[:600])
  for rep in range(2):
    res = timing.time_calls(fns, (x,), n=10, rounds=15)
    b = res["jax_pallas"][0]
    print(f"wall {shape} n=10 pass {rep}: " + "  ".join(f"{k} {m*1e6:.1f}us ({b/m:.3f}x)" for k, (m, lo, hi) in res.items()), flush=True)
