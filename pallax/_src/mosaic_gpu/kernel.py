"""``plgpu.kernel``: a body run once per block of a grid, by ``num_threads`` warpgroup threads."""
from __future__ import annotations

import functools
from collections.abc import Mapping

from pallax._src import kernel as pk
from pallax._src import primitives as prims
from pallax._src import semaphores
from pallax._src.mosaic_gpu import core as mc
from pallax._src.mosaic_gpu import primitives as mp


class _NotSpecified:
  pass


_NS = _NotSpecified()


def kernel(body=_NS, out_shape=None, *, out_type=(), scratch_types=(), compiler_params=None, grid=(),
           grid_names=(), cluster=(), cluster_names=(), num_threads=None, thread_name=None,
           interpret=None, debug=False, scratch_shapes=None, **mesh_kwargs):
  """Runs ``body(*operand_refs, *out_refs, *scratch_refs)`` on every block of ``grid``; with
  ``num_threads``, each block runs it once per thread (``lax.axis_index(thread_name)``), the
  threads sharing the scratch. ``out_shape``/``scratch_shapes`` are accepted for ``out_type``/
  ``scratch_types`` (the spec's spelling)."""
  out_type = out_shape if out_shape is not None else out_type
  scratch_types = scratch_shapes if scratch_shapes is not None else scratch_types
  kw = dict(out_type=out_type, scratch_types=scratch_types, compiler_params=compiler_params,
            grid=grid, grid_names=grid_names, cluster=cluster, cluster_names=cluster_names,
            num_threads=num_threads, thread_name=thread_name, interpret=interpret, debug=debug,
            **mesh_kwargs)
  if isinstance(body, _NotSpecified):
    return lambda fun: kernel(fun, **kw)
  mesh = mc.Mesh(grid=grid, grid_names=grid_names, cluster=cluster, cluster_names=cluster_names,
                 num_threads=num_threads, thread_name=thread_name, **mesh_kwargs)
  unwrap = not isinstance(out_type, (tuple, list))
  outs = (out_type,) if unwrap else tuple(out_type)
  collective = () if thread_name is None else (thread_name,)

  def kernel_body(*refs):
    # pl.semaphore_* in a Mosaic GPU kernel wait for other threads and blocks (mp.SEMAPHORES).
    with semaphores.semaphores_by(mp.SEMAPHORES):
      if isinstance(scratch_types, Mapping):
        prims.run_scoped(functools.partial(body, *refs), collective_axes=collective,
                         **scratch_types)
      else:
        prims.run_scoped(functools.partial(body, *refs), *scratch_types,
                         collective_axes=collective)

  fn = body
  while isinstance(fn, functools.partial):   # a partial names the function it wraps
    fn = fn.func
  kernel_body.__name__ = mesh.kernel_name or getattr(fn, "__name__", "kernel")
  run = pk.kernel(kernel_body, outs, mesh=mesh, compiler_params=compiler_params,
                  interpret=bool(interpret), debug=debug, name=kernel_body.__name__)

  def call(*operands):
    res = run(*operands)
    return res[0] if unwrap else res

  return call
