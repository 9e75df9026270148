"""Mosaic GPU's profiler: ``plgpu.CompilerParams(profile_space=n, profile_dir=d)``.

Every warpgroup of every block (``profile_trace_scope=plgpu.TraceScope.WARP``: every warp)
records when its code enters and leaves each ``jax.named_scope``; after the call, a Chrome trace
of those ranges (``chrome://tracing``, Perfetto) is written to a new file in ``profile_dir``:
one track per warpgroup (or warp), the ranges nested as the scopes are.

What a kernel records is the same in both executors: the same events in the same order; the
times are the GPU's global timer (nanoseconds) on the GPU, the host's clock in the interpreter.

The record is one more output of the call, in GMEM (added here: ``augment``), ``4 * n`` int32
words per warpgroup (or warp), room for ``n`` ranges as Mosaic GPU reserves it: the unit's
start time, its SM, how many events it kept, then a (tag, time) pair per event: tag ``k`` enters
``names[k]``, ``-1 - k`` leaves it. Events past a unit's room are dropped, as Mosaic GPU's
``profile_bounds_check=True`` does (pallax always checks: nothing is written out of bounds), and
the trace closes the ranges left open so. Where Mosaic GPU stages the record in SMEM (16 bytes a
range a warpgroup, counted against the block's shared memory), pallax writes GMEM directly and
takes no shared memory. A kernel that asks for a profile runs on the Mosaic GPU path (Gluon on
the GPU, the eager interpreter elsewhere), whatever its other primitives.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from pallax._src import core as pc
from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src.mosaic_gpu import core as mc

HEADER = 3          # start time, SM, events kept
WORDS_PER_RANGE = 4  # its two events, a tag and a time each
WARPS = 4           # warps in a warpgroup


@dataclasses.dataclass(frozen=True)
class Spec:
  """The record of one profiled call."""
  space: int        # ranges per unit (profile_space)
  directory: str
  per_warp: bool    # a unit is a warp (else a warpgroup)
  threads: int      # warpgroups a block
  blocks: int       # blocks of the call (the grid's, times the cluster's)

  @property
  def units_per_thread(self) -> int:
    return WARPS if self.per_warp else 1

  @property
  def words(self) -> int:
    return WORDS_PER_RANGE * self.space

  @property
  def room(self) -> int:
    """Events a unit keeps."""
    return (self.words - HEADER) // 2

  @property
  def units(self) -> int:
    return self.blocks * self.threads * self.units_per_thread

  def aval(self) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((self.units * self.words,), jnp.int32)


def _spec(compiler_params, grid, threads) -> Spec | None:
  space = getattr(compiler_params, "profile_space", 0) if isinstance(
      compiler_params, mc.CompilerParams) else 0
  if not space:
    return None
  cluster = math.prod(n for _, n in threads.cluster) if threads is not None else 1
  return Spec(int(space), compiler_params.profile_dir,
              compiler_params.profile_trace_scope == mc.TraceScope.WARP,
              threads.num_threads if threads is not None else 1, math.prod(grid) * cluster)


def spec_of(params) -> Spec | None:
  """The profile ``params``' call records (its last output), None if it records none."""
  return _spec(params.compiler_params, params.grid_mapping.grid, params.threads)


def augment(name, compiler_params, grid_spec: pc.GridSpec, out_shape, threads):
  """(profile, kernel wrapper, out_shape, grid_spec, threads) of a call that records a profile:
  its record as one more output, after the others, in GMEM, which the kernel does not see; its
  threads made explicit (the Mosaic GPU path). ``profile`` is None for a call that records none
  (everything else then as given)."""
  if not isinstance(compiler_params, mc.CompilerParams) or not compiler_params.profile_space:
    return None, None, out_shape, grid_spec, threads
  grid = grid_spec.grid if isinstance(grid_spec.grid, tuple) else (grid_spec.grid,)
  if not all(isinstance(g, (int, np.integer)) for g in grid):
    raise NotImplementedError(f"pallas_call {name}: profile_space with the grid {grid}: profile "
                              "a kernel whose grid is of integer sizes")
  spec = _spec(compiler_params, tuple(int(g) for g in grid), threads)
  spread = isinstance(out_shape, (tuple, list))
  outs = (*out_shape, spec.aval()) if spread else (out_shape, spec.aval())
  specs = grid_spec.out_specs
  if specs is not pc.no_block_spec:
    if isinstance(specs, pc.BlockSpec) and not spread:
      specs = (specs, pc.BlockSpec(memory_space=mc.GMEM))
    elif isinstance(specs, (tuple, list)) and spread:
      specs = (*specs, pc.BlockSpec(memory_space=mc.GMEM))
    else:
      raise NotImplementedError(
          f"pallas_call {name}: profile_space with out_specs {specs!r}: give one BlockSpec per "
          "output (a tuple when out_shape is one), or profile a kernel without it")
  n_scratch = 0 if isinstance(grid_spec.scratch_shapes, dict) else \
      len(jax.tree.leaves(grid_spec.scratch_shapes, is_leaf=lambda s: hasattr(s, "get_ref_aval")))

  def without_record(kernel):
    def kernel_of_call(*refs, **scratch):
      k = len(refs) - n_scratch - 1   # the record's Ref: after the outputs, before the scratch
      return kernel(*refs[:k], *refs[k + 1:], **scratch)
    return kernel_of_call

  return (Profile(spec, spread), without_record, outs,
          dataclasses.replace(grid_spec, out_specs=specs),
          threads if threads is not None else mc.ThreadInfo())


@dataclasses.dataclass(frozen=True)
class Profile:
  spec: Spec
  spread: bool    # out_shape was a tuple or a list

  def results(self, params, outs):
    """The call's own results, once its record is on its way to a trace file (a host callback,
    which ``jax.effects_barrier()`` waits for)."""
    names_ = names(params.jaxpr)
    jax.debug.callback(lambda record: write_trace(self.spec, names_, np.asarray(record),
                                                  params.name), outs[-1])
    return tuple(outs[:-1]) if self.spread else outs[0]


def names(jaxpr) -> tuple[str, ...]:
  """The named scopes of a kernel, in the order they first appear: ``names[k]`` is tag ``k``."""
  seen: dict = {}
  for eqn in jaxpr_util.equations(jaxpr):
    for n in ji.named_scopes(eqn.source_info):
      seen.setdefault(n, len(seen))
  return tuple(seen)


def moves(open_: list, path: tuple) -> list[tuple[str, bool]]:
  """The events that take a unit from the scopes ``open_`` (updated) to ``path``: (name, True)
  entering, (name, False) leaving; scopes left innermost first."""
  keep = 0
  while keep < min(len(open_), len(path)) and open_[keep] == path[keep]:
    keep += 1
  out = [(n, False) for n in reversed(open_[keep:])] + [(n, True) for n in path[keep:]]
  open_[keep:] = path[keep:]
  return out


def tag(names_: tuple, name: str, begin: bool) -> int:
  k = names_.index(name)
  return k if begin else -1 - k


def write_trace(spec: Spec, names_: tuple, record: np.ndarray, kernel: str) -> str:
  """Writes the Chrome trace of ``record`` to a new file in the profile directory; returns its
  path."""
  units = record.reshape(spec.units, spec.words).astype(np.int64) & 0xFFFFFFFF
  tracks = [_track(spec, names_, u, k) for k, u in enumerate(units)]
  tracks = sorted((t for t in tracks if t), key=lambda t: t[0]["ts"])
  os.makedirs(spec.directory, exist_ok=True)
  prefix = "".join(c if c.isalnum() or c in "_-" else "_" for c in kernel)
  fd, path = tempfile.mkstemp(prefix=f"{prefix}-", suffix=".json", dir=spec.directory)
  with os.fdopen(fd, "w") as f:
    json.dump({"displayTimeUnit": "ns", "traceEvents": [e for t in tracks for e in t]}, f)
  return path


def _track(spec: Spec, names_: tuple, unit: np.ndarray, k: int) -> list[dict]:
  """One unit's events; ranges left open (events dropped for want of room) closed at its last
  time. Times in microseconds from the unit's start (32-bit timers: taken modulo 2**32)."""
  start, sm, kept = int(unit[0]), int(unit[1]), min(int(unit[2]), spec.room)
  pairs = unit[HEADER:HEADER + 2 * kept].reshape(kept, 2)
  events, open_, last = [], [], 0
  for t, time in pairs:
    t = int(t) - (1 << 32) if t >= 1 << 31 else int(t)
    name, begin = (names_[t], True) if t >= 0 else (names_[-1 - t], False)
    last = (int(time) - start) % (1 << 32)
    if begin:
      open_.append(name)
    elif open_ and open_[-1] == name:
      open_.pop()
    events.append((name, begin, last))
  events += [(n, False, last) for n in reversed(open_)]
  return [{"name": n, "ph": "B" if b else "E", "ts": (start + t) / 1e3, "pid": 1 + sm, "tid": 1 + k}
          for n, b, t in events]


def kept_tags(spec: Spec, record: np.ndarray) -> list[list[int]]:
  """Each unit's kept tags, in order: what two runs of a kernel record alike (times differ)."""
  units = np.asarray(record).reshape(spec.units, spec.words)
  return [[int(t) for t in u[HEADER:HEADER + 2 * min(int(u[2]), spec.room):2]] for u in units]
