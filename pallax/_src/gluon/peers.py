"""Remote references and mesh coordinates in Gluon kernels: the kernel side of ``gpu/peers.py``.

A kernel that reaches its peers gets, after its input operands, the buffers made for its outputs
(unused: the outputs are the same buffers), ``peer_table`` (int64 ``[device, buffer]``: every
device's address of every operand and output) and ``mesh_coords`` (its device's coordinate along
each mesh axis). ``lax.axis_index`` of a mesh axis reads ``mesh_coords``; a remote view of a GMEM
operand (``PeerRef``) is the same view from the peer's address, ``gl.load(peer_table + ...)``
cast to a pointer. Where the device a remote view names is known at the kernel's start (mesh
coordinates and constants: JAX's collective matmul sends to "the next device"), its address and
its TMA descriptors are made once there; elsewhere the address is read where the view is used,
and TMA copies through it are refused (a descriptor per copy would cost more than the copy).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from pallax._src import jax_internals as ji
from pallax._src import jaxpr_util
from pallax._src import remote
from pallax._src.gpu import expr as ex

I32 = np.dtype(np.int32)


@dataclasses.dataclass
class Peers:
  """What a kernel's code knows of its peers: ``columns``, operand pointer -> its column of the
  table; ``mesh``, mesh axis -> the variable of its coordinate; ``pointers``, (column, device)
  -> the variable of the peer's address, with ``lines`` the kernel's first statements."""
  exchange: object            # gpu.peers.Exchange
  columns: dict
  mesh: dict
  read: set                   # the mesh axes whose coordinate the kernel reads
  pointers: dict = dataclasses.field(default_factory=dict)
  lines: list = dataclasses.field(default_factory=list)
  scalars: dict = dataclasses.field(default_factory=dict)   # scalar variable -> its expression


def start(gen, exchange, refs, jaxpr) -> None:
  """Gives ``gen`` (a Writer) the kernel's peers and the mesh axes as ``lax.axis_index`` axes."""
  mesh = {a: ex.Name(gen.fresh(f"mesh_{a}"), dtype=I32) for a, _ in exchange.axes
          if a not in gen.axes}   # (the kernel's own axes win over mesh axes of their name)
  read = {e.params["axis_name"] for e in jaxpr_util.equations(jaxpr)
          if e.primitive is ji.axis_index_p and e.params["axis_name"] in mesh}
  gen.peers = Peers(exchange, {r.ptr: k for k, r in enumerate(refs)}, mesh, read)
  gen.axes.update(mesh)


def parameters(signature: dict, host: tuple, exchange) -> tuple[dict, tuple]:
  """The kernel's parameters with the exchange's operands after the inputs."""
  names = list(signature)
  n = exchange.n_in
  extra = {f"out{j}_buffer": "*i8" for j in exchange.fresh}
  if exchange.remote:
    extra["peer_table"] = "*i64"
  extra["mesh_coords"] = "*i32"
  sig = {k: signature[k] for k in names[:n]} | extra | {k: signature[k] for k in names[n:]}
  return sig, (*host[:n], *[None] * len(extra), *host[n:])


def kernel_start(gen) -> list[str]:
  """The kernel's first statements: the mesh coordinates it reads, then the peer addresses made
  at its start."""
  if gen.peers is None:
    return []
  coords = [f"    {gen.peers.mesh[a].name} = gl.load(mesh_coords + {k})"
            for k, (a, _) in enumerate(gen.peers.exchange.axes) if a in gen.peers.read]
  return coords + [f"    {line}" for line in gen.peers.lines]


def shared_names(gen) -> list[str]:
  """Variables of the kernel's start that its partitions read."""
  if gen.peers is None:
    return []
  return [gen.peers.mesh[a].name for a in sorted(gen.peers.read)] + \
      list(gen.peers.pointers.values())


def resolve(gen, ref, transforms, tma: bool = False):
  """(``ref``, ``transforms``) with a remote view made local to the peer's buffer: a GmemRef
  whose pointer is the peer's address (``tma``: for a TMA copy, whose descriptor is made at the
  kernel's start)."""
  views = [t for t in transforms if isinstance(t, remote.PeerRef)]
  if not views:
    return ref, transforms
  rest = tuple(t for t in transforms if not isinstance(t, remote.PeerRef))
  if gen.peers is None or not gen.peers.exchange.remote:
    gen.unsupported(f"a remote reference to {ref.origin} outside a kernel given its peers")
  ptr = _peer_pointer(gen, ref, _logical_id(gen, views[-1]))
  if tma and ptr not in gen.peers.pointers.values():
    gen.unsupported(f"a TMA copy to or from {ref.origin} of a device that the kernel computes "
                    "after its start (TMA descriptors of peers are made once, at the start: "
                    "name the device from lax.axis_index of mesh axes and constants)")
  return dataclasses.replace(ref, ptr=ptr, origin=f"{ref.origin} (of a peer)"), rest


def _peer_pointer(gen, ref, lid: ex.Expr) -> str:
  """The variable of the peer's address of ``ref`` on the device of row ``lid``: made at the
  kernel's start (once per column and device) where ``lid`` is computable there, else here."""
  p = gen.peers
  at_start = _inlined(lid, p.scalars)
  start = ex.names(at_start) <= {n.name for n in p.mesh.values()}
  lid = at_start if start else lid
  col = p.columns[ref.ptr]
  offset = ex.add(ex.mul(lid, p.exchange.columns), ex.Lit(col, dtype=I32))
  text = (f"gl.load(peer_table + {gen.render(offset, 12)}).to(gl.pointer_type("
          f"{ex.dtype_name(ref.dtype, 'gl')}))")
  key = (col, gen.render(lid))
  if start and key in p.pointers:
    return p.pointers[key]
  name = gen.fresh(f"peer_{ref.ptr.removesuffix('_ptr')}")
  if start:
    p.pointers[key] = name
    p.lines.append(f"{name} = {text}")
  else:
    gen.emit_scalar(f"{name} = {text}")
  return name


def _inlined(e: ex.Expr, scalars: dict, seen: frozenset = frozenset()) -> ex.Expr:
  """``e`` with the scalar variables it reads replaced by their expressions, recursively (what
  it computes from the kernel's start, where that is all it reads). A variable assigned again
  (a loop's carry) stays a variable."""
  if isinstance(e, ex.Name) and e.name in scalars and e.name not in seen:
    return _inlined(scalars[e.name], scalars, seen | {e.name})
  if isinstance(e, ex.Op):
    return dataclasses.replace(e, args=tuple(_inlined(a, scalars, seen) for a in e.args))
  if isinstance(e, ex.Call) and isinstance(e.fn, str):
    return dataclasses.replace(e, args=tuple(
        _inlined(a, scalars, seen) if isinstance(a, ex.Expr) else a for a in e.args))
  return e


def _as_expr(v) -> ex.Expr:
  return v if isinstance(v, ex.Expr) else ex.Lit(int(v), dtype=I32)


def _logical_id(gen, t) -> ex.Expr:
  """The row of the table of the device ``t`` names (row-major over the mesh axes)."""
  axes = gen.peers.exchange.axes
  names = [a for a, _ in axes]
  d = t.device_id
  if t.device_id_type is remote.DeviceIdType.LOGICAL or (
      not isinstance(d, (dict, tuple, list)) and len(axes) <= 1):
    return _as_expr(d)
  if isinstance(d, dict):
    coords = {**gen.peers.mesh, **{k: _as_expr(v) for k, v in d.items()}}
    gen.peers.read.update(set(names) - set(d))   # the caller's own coordinates
  elif isinstance(d, (tuple, list)):
    coords = dict(zip(names, map(_as_expr, d)))
  else:
    raise ValueError(f"device_id names no device of the mesh of axes {tuple(names)}: pass "
                     "device_id_type=pl.DeviceIdType.LOGICAL, or a tuple/dict of coordinates")
  if set(coords) != set(names):
    raise ValueError(f"device_id={d} does not give a coordinate for each mesh axis {tuple(names)}")
  lid: ex.Expr = ex.Lit(0, dtype=I32)
  for a, size in axes:
    lid = ex.add(ex.mul(lid, size), coords[a])
  return lid
