"""References to other devices' memory: ``plgpu.remote_ref`` and ``device_id=`` of semaphore signals.

A remote reference is a Ref transform, ``PeerRef(device_id)``: the same buffer (same shape and
offset) on the device ``device_id`` of the mesh the kernel runs under (``jax.shard_map``). The
memory every device has at the same place is the kernel's GMEM operands, outputs and
``pl.get_global`` semaphores ("symmetric" memory). The interpreter resolves the transform to the
peer's buffer (``interpret/devices.py``); GPU backends refuse kernels that use it
(``refuse_on_gpu``) until they can address a peer's memory (docs/distributed.md).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

import jax

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util


class DeviceIdType(enum.Enum):
  """How a ``device_id`` names a device: MESH, coordinates in the mesh (an int for a mesh of
  one axis, or a tuple/dict over its axes); LOGICAL, the device's index in row-major order."""
  MESH = "mesh"
  LOGICAL = "logical"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PeerRef(ji.Transform):
  """The Ref it follows, on device ``device_id`` (an int32 scalar, traced or not)."""
  device_id: Any
  device_id_type: DeviceIdType = dataclasses.field(default=DeviceIdType.MESH,
                                                   metadata=dict(static=True))

  def transform_type(self, x):
    return x   # the same buffer, elsewhere: its type does not change

  def undo(self, x):
    raise NotImplementedError("a remote reference has no inverse")

  def commute_ndindexer(self, _, indexer):
    return indexer, self


def remote_ref(ref, device_id, device_id_type: DeviceIdType = DeviceIdType.MESH):
  """``ref`` (a GMEM operand or output, or a ``pl.get_global`` semaphore) on the device
  ``device_id`` of the mesh: reads, writes and copies through it reach that device's memory."""
  if not isinstance(ref, ji.TransformedRef):
    if not ji.is_ref_aval(jax.typeof(ref)):
      raise TypeError(f"remote_ref takes a Ref, not {jax.typeof(ref).str_short()}")
    ref = ji.TransformedRef(ref, ())
  if any(isinstance(t, PeerRef) for t in ref.transforms):
    raise ValueError("remote_ref of a Ref that is already remote: pass the local Ref")
  return ji.TransformedRef(ref.ref, (*ref.transforms, PeerRef(device_id, device_id_type)))


class PeerError(ValueError):
  """A remote reference the interpreter cannot follow (its thread adds where it happened)."""


@dataclasses.dataclass(eq=False)
class Peers:
  """One symmetric buffer on every device of a mesh: ``buffers[logical id]``; ``axes``: the
  mesh's axis sizes (row-major order gives logical ids); ``coords``: the owner's coordinates."""
  axes: dict
  buffers: list
  coords: dict

  def logical_id(self, t: PeerRef) -> int:
    d, names = t.device_id, tuple(self.axes)
    if isinstance(d, dict):
      coords = {**self.coords, **{k: int(v) for k, v in d.items()}}
    elif isinstance(d, (tuple, list)):
      coords = dict(zip(names, (int(v) for v in d)))
    elif t.device_id_type is DeviceIdType.LOGICAL or len(names) <= 1:
      return self._checked(int(d), int(d))
    else:
      raise PeerError(f"device_id={int(d)} names no device of the mesh of axes {names}: pass "
                      "device_id_type=pl.DeviceIdType.LOGICAL, or a tuple/dict of coordinates")
    unknown = set(coords) - set(names)
    if unknown or len(coords) != len(names):
      raise PeerError(f"device_id={d} does not give a coordinate for each mesh axis {names}")
    lid = 0
    for n in names:
      if not 0 <= coords[n] < self.axes[n]:
        raise PeerError(f"device_id={d}: coordinate {coords[n]} of mesh axis {n!r} is outside "
                        f"0..{self.axes[n] - 1}")
      lid = lid * self.axes[n] + coords[n]
    return lid

  def _checked(self, lid: int, given) -> int:
    if not 0 <= lid < len(self.buffers):
      raise PeerError(f"device_id={given} is outside the mesh ({len(self.buffers)} devices: "
                      + ", ".join(f"{k}={v}" for k, v in self.axes.items()) + ")")
    return lid


def peer_buffer(buf, t: PeerRef):
  """The buffer ``buf`` of the device that ``t`` names."""
  peers = buf.state.get("peers")
  if peers is None:
    raise PeerError(
        f"a remote reference (plgpu.remote_ref, or device_id=) to {buf.name}, in "
        f"{buf.space.upper()}: only the kernel's GMEM operands, outputs and pl.get_global "
        "semaphores are at the same place on every device; use one of those (copy SMEM data "
        "to a GMEM output, signal a pl.get_global semaphore)")
  return peers.buffers[peers.logical_id(t)]


def _peer_in(value) -> bool:
  """Whether an equation parameter (a transform tree, or a tuple of them) holds a PeerRef."""
  if isinstance(value, (tuple, list)):
    return any(_peer_in(v) for v in value)
  if isinstance(value, jax.tree_util.PyTreeDef):
    return "PeerRef" in str(value)   # the treedef names its node types; no leaves needed
  return False


def uses_remote(closed_jaxpr) -> bool:
  """Whether a kernel jaxpr reaches another device's memory (a PeerRef in any transform)."""
  return any(_peer_in(v) for eqn in jaxpr_util.equations(closed_jaxpr)
             for v in eqn.params.values())


def mesh_axes_read(params) -> list:
  """The mesh axes whose ``lax.axis_index`` the kernel reads (the kernel's own thread and
  cluster axes win over mesh axes of the same name)."""
  info = getattr(params, "threads", None)
  own = {n for n, _ in info.axis_env()} if info is not None else set()
  mesh = set(ji.mesh_axis_sizes()) - own
  return [e.params["axis_name"] for e in jaxpr_util.equations(params.jaxpr)
          if e.primitive is ji.axis_index_p and e.params["axis_name"] in mesh]


def refuse_on_gpu(params, backend: str) -> None:
  """The Triton backend cannot address a peer's memory (the Gluon backend can:
  ``gpu/peers.py``): a clear error, never a wrong answer."""
  if uses_remote(params.jaxpr):
    raise NotImplementedError(
        f"pallas_call {params.name}: references to other devices' memory (plgpu.remote_ref, "
        f"semaphore_signal(..., device_id=...)) are not supported by the {backend} backend yet "
        "(docs/distributed.md): write the kernel with pallax.mosaic_gpu (the Gluon backend "
        "reaches peers), run it in pallax's interpreter (interpret=True, under jax.shard_map), "
        "or move data between devices with collectives (lax.all_gather, lax.ppermute) around "
        "the kernel")
