"""The eager interpreter's memory: NumPy buffers written in place, and views of them (a buffer
and the chain of ``.at[...]``/``.transpose`` transforms a Ref inside the evaluator carries).

Where checks for uninitialized data are on, a buffer that starts poisoned keeps an ``init`` mask
of the elements written; writes set it (a copy passes on its source's, ``read_init``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import primitives as prims
from pallax._src import remote

@dataclasses.dataclass(eq=False)
class Buffer:
  """One allocation: its data, where it lives, and what checks need to remember about it."""
  name: str
  space: str                 # "gmem", "smem", "regs", "barrier", "semaphore"
  data: np.ndarray
  kind: Any = None           # the scratch type it was allocated from
  state: dict = dataclasses.field(default_factory=dict)
  init: np.ndarray | None = None   # with uninit checks: which elements were written (None: all)


@dataclasses.dataclass(frozen=True, eq=False)
class View:
  """A Ref inside the evaluator: a buffer seen through transforms."""
  buf: Buffer
  transforms: tuple = ()

  def at(self, more) -> "View":
    view = self
    for t in more:   # a remote or cluster peer's reference: the same transforms, on its buffer
      elsewhere = getattr(t, "peer_buffer", None)
      view = (View(remote.peer_buffer(view.buf, t), view.transforms) if isinstance(t, remote.PeerRef)
              else View(elsewhere(view.buf), view.transforms) if elsewhere is not None
              else View(view.buf, view.transforms + (t,)))
    return view

  @property
  def shape(self) -> tuple[int, ...]:
    return shapes_of(self.buf.data.shape, self.buf.data.dtype, self.transforms)[-1]


def shapes_of(shape, dtype, transforms) -> list[tuple[int, ...]]:
  out = [tuple(shape)]
  for t in transforms:
    if isinstance(t, ji.NDIndexer):
      out.append(tuple(t.get_indexer_shape()))
    else:
      out.append(tuple(t.transform_type(ji.ShapedArray(out[-1], dtype)).shape))
  return out


def _np(x):
  return np.asarray(x)


def _parent_coords(indexer, coords):
  """Coordinates in the indexed array of the elements at ``coords`` of an NDIndexer's result."""
  slice_dims, int_dims = prims.indexer_dims(indexer)
  shape = coords[0].shape if coords else ()
  out, k = [], 0
  for i in indexer.indices:
    if isinstance(i, ji.Slice):
      out.append(int(_np(i.start)) + int(i.stride) * coords[slice_dims[k]])
      k += 1
    elif np.ndim(i) == 0:
      out.append(np.broadcast_to(_np(i).astype(np.int64), shape))
    else:
      out.append(_np(i).astype(np.int64)[tuple(coords[d] for d in int_dims)])
  return out


def view_coords(view: View) -> list[np.ndarray]:
  """Per base dimension, the base coordinate of every element of ``view`` (shape: the view's)."""
  shapes = shapes_of(view.buf.data.shape, view.buf.data.dtype, view.transforms)
  coords = list(np.indices(shapes[-1], dtype=np.int64)) if shapes[-1] else []
  for t, inner in zip(reversed(view.transforms), reversed(shapes[:-1])):
    if isinstance(t, ji.NDIndexer):
      coords = _parent_coords(t, coords)
    elif isinstance(t, ji.TransposeRef):
      base = [None] * len(coords)
      for k, p in enumerate(t.permutation):
        base[p] = coords[k]
      coords = base
    elif isinstance(t, ji.ReshapeRef):
      outer = shapes[shapes.index(inner) + 1]
      flat = np.ravel_multi_index(coords, outer) if coords else np.zeros((), np.int64)
      coords = list(np.unravel_index(flat, inner))
    else:
      raise NotImplementedError(f"the interpreter cannot follow the Ref transform {t}")
  return coords


def in_bounds(coords, shape) -> np.ndarray:
  ok = np.ones(coords[0].shape if coords else (), bool)
  for c, d in zip(coords, shape):
    ok &= (c >= 0) & (c < d)
  return ok


def flat_indices(view: View) -> np.ndarray:
  """The in-bounds elements of ``view``, as flat indices into its buffer."""
  coords = view_coords(view)
  if not coords:
    return np.zeros(1, np.int64)
  ok = in_bounds(coords, view.buf.data.shape)
  return np.ravel_multi_index([c[ok] for c in coords], view.buf.data.shape)


def read(view: View, fill=None, coords=None) -> np.ndarray:
  """The elements of ``view``; out of bounds: an error, or ``fill`` where given. ``coords``:
  ``view_coords(view)`` if the caller has them already."""
  coords = view_coords(view) if coords is None else coords
  data = view.buf.data
  if not coords:
    return data.copy()
  ok = in_bounds(coords, data.shape)
  if not ok.all() and fill is None:
    raise IndexError(oob_message(view, coords, ok, "read from"))
  out = data[tuple(np.clip(c, 0, d - 1) for c, d in zip(coords, data.shape))]
  return out if ok.all() else np.where(ok, out, np.asarray(fill, data.dtype))


def write(view: View, value, drop_out_of_bounds=False, accumulate=False, coords=None,
          init=True) -> None:
  """Writes ``value`` into ``view``; where the buffer tracks initialization, the elements become
  ``init`` (True, or a copy's source mask from ``read_init``)."""
  coords = view_coords(view) if coords is None else coords
  data = view.buf.data
  shape = coords[0].shape if coords else data.shape
  value = np.broadcast_to(np.asarray(value, data.dtype), shape)
  init = np.broadcast_to(init, shape)
  if not coords:
    data[...] = data + value if accumulate else value
    if view.buf.init is not None:
      view.buf.init[...] = init
    return
  ok = in_bounds(coords, data.shape)
  if not ok.all():
    if not drop_out_of_bounds:
      raise IndexError(oob_message(view, coords, ok, "write to"))
    coords, value, init = [c[ok] for c in coords], value[ok], init[ok]
  if accumulate:
    np.add.at(data, tuple(coords), value)
  else:
    data[tuple(coords)] = value
  if view.buf.init is not None:
    view.buf.init[tuple(coords)] = init


def read_init(view: View, coords=None) -> np.ndarray:
  """Which elements of ``view`` were written (True where the buffer does not track it, and
  out of bounds, where reads are filled)."""
  if view.buf.init is None:
    return np.ones(view.shape, bool)
  coords = view_coords(view) if coords is None else coords
  if not coords:
    return view.buf.init.copy()
  ok = in_bounds(coords, view.buf.data.shape)
  got = view.buf.init[tuple(np.clip(c, 0, d - 1) for c, d in zip(coords, view.buf.data.shape))]
  return got | ~ok


def oob_message(view, coords, ok, verb):
  bad = tuple(int(c[~ok].ravel()[0]) for c in coords)
  return (f"out-of-bounds {verb} {view.buf.name} (shape {view.buf.data.shape}): element {bad} "
          f"of a view of shape {view.shape}")
