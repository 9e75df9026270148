"""Spec 003 names pallax does not run yet: each says what it is, why, and what works instead."""
from __future__ import annotations


def _unsupported(name: str, why: str, instead: str):
  def fn(*args, **kwargs):
    raise NotImplementedError(f"plgpu.{name}: {why} are not supported by pallax yet; {instead}")
  fn.__name__ = name
  fn.__doc__ = f"Not supported yet: {why}."
  return fn


_MULTIMEM = ("multimem (NVLink multicast) operations", "use shard_map with collectives around the kernel")

multimem_store = _unsupported("multimem_store", *_MULTIMEM)
multimem_load_reduce = _unsupported("multimem_load_reduce", *_MULTIMEM)
semaphore_signal_multicast = _unsupported("semaphore_signal_multicast", *_MULTIMEM)
multicast_ref = _unsupported("multicast_ref", *_MULTIMEM)
inline_mgpu = _unsupported("inline_mgpu", "inline Mosaic GPU IR", "write the operation in JAX")
griddepcontrol_wait = _unsupported("griddepcontrol_wait", "programmatic dependent launch",
                                   "let XLA order the kernels")
griddepcontrol_launch_dependents = _unsupported("griddepcontrol_launch_dependents",
                                                "programmatic dependent launch", "let XLA order the kernels")

