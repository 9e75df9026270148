"""Where a small jitted call's host time goes, pallax against JAX Pallas and plain XLA: Python
frames entered per call (the C++ fast path enters none), host dispatch time per call (calls
queued without waiting; the kernels take ~1.5 µs, less than the dispatch), back-to-back time
(10 calls, then a wait), and what the compiled executable holds (parameters, results, temp
bytes). Writes each side's optimized HLO to ``$OUT``. A research probe for issue 13.

    PYTHONPATH=$PWD python3 benchmarks/probes/probe_dispatch.py
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import importlib  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_gpu_ops  # noqa: E402
import triton_vs_pallas as tvp  # noqa: E402
import timing  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")


def python_frames_per_call(f, args, calls=20):
  seen = []
  def prof(frame, event, arg):
    if event == "call":
      seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
  jax.block_until_ready(f(*args))
  sys.setprofile(prof)
  try:
    for _ in range(calls):
      f(*args)
  finally:
    sys.setprofile(None)
  return len(seen) / calls, sorted(set(seen))[:12]


def dispatch_us(fns, args, n=300, rounds=21):
  """Median host µs per call with calls queued and no wait inside the timed region."""
  samples = {k: [] for k in fns}
  order, rng = list(fns), np.random.default_rng(1)
  for _ in range(rounds):
    rng.shuffle(order)
    for k in order:
      f = fns[k]
      jax.block_until_ready(f(*args))
      t = time.perf_counter()
      for _ in range(n):
        out = f(*args)
      dt = time.perf_counter() - t
      jax.block_until_ready(out)
      samples[k].append(dt / n * 1e6)
  return {k: float(np.median(v)) for k, v in samples.items()}


def describe(name, f, args):
  c = f.lower(*args).compile()
  text = c.as_text()
  with open(os.path.join(OUT, f"{name}.hlo"), "w") as fh:
    fh.write(text)
  m = c.memory_analysis()
  entry = text[text.index("ENTRY"):]
  return (f"{name}: {len(jax.tree.leaves(args))} args, temp {m.temp_size_in_bytes} B, "
          f"out {m.output_size_in_bytes} B, alias {m.alias_size_in_bytes} B, "
          f"{entry.count(chr(10))} ENTRY lines")


def _add_one(x_ref, o_ref):
  o_ref[...] = x_ref[...] + 1


def cases():
  import pallax
  from jax.experimental.pallas import triton as jplt
  JP = tvp.jax_pallas()
  x = jax.random.normal(jax.random.key(int(time.time())), (128,), jnp.float32)
  S = jax.ShapeDtypeStruct
  trivial = lambda P, cp: lambda x: P.pallas_call(  # noqa: E731
      _add_one, out_shape=S(x.shape, x.dtype), compiler_params=cp)(x)
  import pallax.triton as plt_
  yield "x+1", (x,), {"pallax": trivial(pallax, plt_.CompilerParams()),
                      "jax_pallas": trivial(JP, jplt.CompilerParams()), "xla": lambda x: x + 1}
  import jax.experimental.pallas.ops.gpu as gpu_ops
  ks = iter(jax.random.split(jax.random.key(int(time.time()) + 1), 8))
  for op in ("layer_norm", "rms_norm"):
    shape = (1, 16, 1024)
    args = tuple(jax.random.normal(next(ks), s) for s in (shape, shape[-1:], shape[-1:]))
    pm, jm = jax_gpu_ops.load(op), importlib.import_module(f"{gpu_ops.__name__}.{op}")
    ref = {"layer_norm": jax_gpu_ops._ln_ref, "rms_norm": jax_gpu_ops._rms_ref}[op]
    yield op, args, {"pallax": lambda x, w, b, m=pm, o=op: getattr(m, o)(x, w, b),
                     "jax_pallas": lambda x, w, b, m=jm, o=op: getattr(m, o)(x, w, b),
                     "xla": ref}


def main():
  print(jax.devices()[0].device_kind)
  for label, args, raw in cases():
    fns = {k: jax.jit(f) for k, f in raw.items()}
    want = np.asarray(fns["xla"](*args))
    print(f"\n=== {label}")
    for k, f in fns.items():
      np.testing.assert_allclose(np.asarray(f(*args)), want, rtol=1e-4, atol=1e-4, err_msg=k)
      print(" ", describe(f"{label}_{k}", f, args))
      frames, names = python_frames_per_call(f, args)
      print(f"  {k}: {frames:.1f} Python frames per call {names if frames else ''}")
    d = dispatch_us(fns, args)
    b = {k: v[0] * 1e6 for k, v in timing.time_calls(fns, args, n=10, rounds=21).items()}
    compiled = {k: f.lower(*args).compile() for k, f in fns.items()}
    dc = dispatch_us(compiled, args)
    for k in fns:
      print(f"  {k:11s} dispatch {d[k]:6.1f} µs/call (compiled object {dc[k]:6.1f}), "
            f"back-to-back {b[k]:6.1f} µs/call")


if __name__ == "__main__":
  main()
