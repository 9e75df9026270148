"""Mosaic GPU's profiler (``plgpu.CompilerParams(profile_space=, profile_dir=)``): the trace file
a profiled call writes, its tracks and ranges, in the interpreter; the kernel lowered to Gluon
(its record written with the GPU's timer). On a GPU the conftest runs each kernel on Gluon too
and compares the events the two executors record (gluon_check.py; the times differ)."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pallax as pl
import pallax.mosaic_gpu as plgpu

pytestmark = pytest.mark.interpreter


def traced(fn, *args, tmp_path):
  """(fn's results, the events of the one trace file it wrote: (name, phase, track) each, and
  the times of each track)."""
  out = jax.block_until_ready(fn(*args))
  jax.effects_barrier()
  [name] = os.listdir(tmp_path)
  with open(tmp_path / name) as f:
    events = json.load(f)["traceEvents"]
  times = {}
  for e in events:
    times.setdefault(e["tid"], []).append(e["ts"])
  return out, [(e["name"], e["ph"], e["tid"]) for e in events], times


def scoped(x_ref, o_ref):
  with jax.named_scope("add"):
    with jax.named_scope("load"):
      x = x_ref[...]
    y = x + x
  with jax.named_scope("store"):
    o_ref[...] = y


def nested_ranges(track):
  return [("add", "B", track), ("load", "B", track), ("load", "E", track), ("add", "E", track),
          ("store", "B", track), ("store", "E", track)]


@pytest.mark.parametrize("n", [256, 200])
def test_each_named_scope_is_a_range_of_the_warpgroups_track(tmp_path, n):
  x = jax.random.normal(jax.random.key(n), (n,), jnp.float32)
  call = pl.pallas_call(scoped, out_shape=jax.ShapeDtypeStruct((n,), jnp.float32),
                        compiler_params=plgpu.CompilerParams(profile_space=16,
                                                             profile_dir=str(tmp_path)))
  y, events, times = traced(call, x, tmp_path=tmp_path)
  np.testing.assert_array_equal(y, x + x)
  assert events == nested_ranges(1)
  assert times[1] == sorted(times[1])


def test_warp_scope_gives_each_warp_a_track(tmp_path):
  x = jax.random.normal(jax.random.key(1), (256,), jnp.float32)
  params = plgpu.CompilerParams(profile_space=16, profile_dir=str(tmp_path),
                                profile_trace_scope=plgpu.TraceScope.WARP)
  call = pl.pallas_call(scoped, out_shape=jax.ShapeDtypeStruct((256,), jnp.float32),
                        compiler_params=params)
  y, events, _ = traced(call, x, tmp_path=tmp_path)
  np.testing.assert_array_equal(y, x + x)
  assert sorted(events, key=lambda e: e[2]) == [e for w in range(1, 5) for e in nested_ranges(w)]


def test_events_past_the_room_are_dropped_and_open_ranges_closed(tmp_path):
  def kernel(x_ref, o_ref):
    with jax.named_scope("a"), jax.named_scope("b"), jax.named_scope("c"):
      y = x_ref[...] * 3
    with jax.named_scope("d"):
      o_ref[...] = y

  x = jax.random.normal(jax.random.key(2), (128,), jnp.float32)
  # profile_space=3: 12 words, 3 of them the header: room for 4 events (B a, B b, B c, E c)
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128,), jnp.float32),
                        compiler_params=plgpu.CompilerParams(profile_space=3,
                                                             profile_dir=str(tmp_path)))
  y, events, _ = traced(call, x, tmp_path=tmp_path)
  np.testing.assert_array_equal(y, x * 3)
  assert events == [("a", "B", 1), ("b", "B", 1), ("c", "B", 1), ("c", "E", 1), ("b", "E", 1),
                    ("a", "E", 1)]


def test_loops_repeat_their_ranges_and_each_thread_has_a_track(tmp_path):
  def body(x_ref, o_ref):
    def step(i, c):
      with jax.named_scope("step"):
        return c + x_ref[...]
    with jax.named_scope("loop"):
      acc = lax.fori_loop(0, 3, step, jnp.zeros((128,), jnp.float32))

    @pl.when(lax.axis_index("wg") == 1)
    def _():
      with jax.named_scope("store"):
        o_ref[...] = acc

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32), num_threads=2,
                        thread_name="wg",
                        compiler_params=plgpu.CompilerParams(profile_space=8,
                                                             profile_dir=str(tmp_path)))
  x = jax.random.normal(jax.random.key(3), (128,), jnp.float32)
  y, events, _ = traced(kernel, x, tmp_path=tmp_path)
  np.testing.assert_allclose(y, 3 * x, rtol=1e-6)
  loop = lambda t: ([("loop", "B", t)] + [("step", "B", t), ("step", "E", t)] * 3  # noqa: E731
                    + [("loop", "E", t)])
  by_track = sorted(events, key=lambda e: e[2])
  assert by_track == loop(1) + loop(2) + [("store", "B", 2), ("store", "E", 2)]


def test_every_block_has_its_tracks(tmp_path):
  def kernel(x_ref, o_ref):
    with jax.named_scope("double"):
      o_ref[...] = x_ref[...] * 2

  x = jax.random.normal(jax.random.key(4), (3, 128), jnp.float32)
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((3, 128), jnp.float32), grid=(3,),
                        in_specs=[pl.BlockSpec((None, 128), lambda i: (i, 0))],
                        out_specs=pl.BlockSpec((None, 128), lambda i: (i, 0)),
                        compiler_params=plgpu.CompilerParams(profile_space=4,
                                                             profile_dir=str(tmp_path)))
  y, events, _ = traced(call, x, tmp_path=tmp_path)
  np.testing.assert_array_equal(y, x * 2)
  assert sorted(events, key=lambda e: e[2]) == [
      e for t in (1, 2, 3) for e in (("double", "B", t), ("double", "E", t))]


def test_the_gluon_kernel_reads_the_gpus_timer():
  call = pl.pallas_call(scoped, out_shape=jax.ShapeDtypeStruct((256,), jnp.float32),
                        compiler_params=plgpu.CompilerParams(profile_space=16,
                                                             profile_dir="/unused"))
  [compiled] = plgpu.lower(call, jax.ShapeDtypeStruct((256,), jnp.float32))
  assert compiled.ptx.count("%globaltimer_lo") == 7   # the start, then each of the 6 events
  assert "%smid" in compiled.ptx


def test_a_profile_needs_a_directory():
  with pytest.raises(ValueError, match="profile_dir"):
    plgpu.CompilerParams(profile_space=4)


def test_a_scope_whose_values_go_unused_is_still_a_range(tmp_path):
  def kernel(x_ref, o_ref):
    with jax.named_scope("unused"):
      _ = jnp.exp(x_ref[...])   # nothing reads it (the Gluon kernel leaves it out)
    with jax.named_scope("store"):
      o_ref[...] = x_ref[...] + 1

  x = jax.random.normal(jax.random.key(5), (128,), jnp.float32)
  call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128,), jnp.float32),
                        compiler_params=plgpu.CompilerParams(profile_space=8,
                                                             profile_dir=str(tmp_path)))
  y, events, _ = traced(call, x, tmp_path=tmp_path)
  np.testing.assert_array_equal(y, x + 1)
  assert events == [("unused", "B", 1), ("unused", "E", 1), ("store", "B", 1), ("store", "E", 1)]
