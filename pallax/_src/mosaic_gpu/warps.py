"""``plgpu.warp_map``: code run by each of the four warps of a warpgroup thread, and its meaning
in the eager interpreter (four threads of their own, which may wait on each other and on the
block's other threads, as the warps of Blackwell kernels do: one issues TMA copies, one MMAs)."""
from __future__ import annotations

from jax import lax

from pallax._src import jax_internals as ji
from pallax._src import backends
from pallax._src.interpret import eager
from pallax._src.interpret.eager import rule

WARPS = 4   # warps in a warpgroup


class WarpAxis:
  """The axis of one ``warp_map``: ``lax.axis_index`` of it is the warp's index."""

  def __repr__(self):
    return "warp"


def _abstract_eval(*args, jaxpr, axis_name):
  effects = set()
  for eff in jaxpr.effects:
    if isinstance(eff, ji.effects.JaxprInputEffect):
      if eff.input in jaxpr.invars:
        effects.add(eff.replace(jaxpr.invars.index(eff.input)))
    else:
      effects.add(eff)
  return [], effects


warp_map_p = ji.Primitive("warp_map")
warp_map_p.multiple_results = True
warp_map_p.def_effectful_abstract_eval(_abstract_eval)
backends.register_kernel_primitives("mosaic_gpu", (warp_map_p,))


def warp_map(f, /) -> None:
  """Runs ``f(warp_id)`` once per warp of the calling warpgroup thread (``warp_id`` in 0..3);
  the warps run concurrently (each waits on barriers of its own)."""
  axis = WarpAxis()
  in_warps(lambda: f(lax.axis_index(axis)), axis)


def in_warps(f, axis) -> None:
  """Runs ``f()`` once per warp of the calling thread, ``lax.axis_index(axis)`` the warp's
  index (``pl.core_map(plgpu.WarpMesh(axis_name=axis))``)."""
  def body():
    f()
    return []

  jaxpr, _, consts = ji.trace_to_jaxpr(body, [], name=getattr(f, "__name__", "warp_map"),
                                       axes=[(axis, WARPS)])
  if jaxpr.outvars:
    raise ValueError("plgpu.warp_map: the function must return None")
  warp_map_p.bind(*consts, jaxpr=jaxpr, axis_name=axis)


def _warps(th) -> list:
  """The four warp threads of ``th``: made once, so that what each learned (barrier phases,
  operations awaited) carries over from one ``warp_map`` to the next."""
  warps = th.state.get("warps")
  if warps is None:
    label = f"{th.name}={th.index}, warp" if th.name is not None else "warp"
    warps = [eager.Thread(th.block, w, label, dict(th.axes)) for w in range(WARPS)]
    th.state["warps"] = warps
    th.block.state.setdefault("threads", [th]).extend(warps)
  return warps


@rule(warp_map_p)
def _warp_map(th, eqn, invals):
  axis, warps = eqn.params["axis_name"], _warps(th)
  gens, waits = {}, {}
  for w in warps:
    w.axes = {**th.axes, axis: w.index}
    gens[w] = eager.eval_jaxpr(w, eqn.params["jaxpr"], [], list(invals))
    waits[w] = None
  while gens:
    polled = False
    for w in list(gens):
      wait = waits[w]
      if wait is not None and not wait.poll and not wait.ready():
        continue
      try:
        waits[w] = gens[w].send(None)
      except StopIteration:
        del gens[w], waits[w]
        continue
      polled |= waits[w] is not None and waits[w].poll
    if gens:   # the block's other threads run before the warps go on
      pending = dict(waits)
      yield eager.Wait(
          lambda: any(x is None or x.poll or x.ready() for x in pending.values()),
          lambda: "; ".join(f"{w.describe()} {_what(x)} at {w.line or 'a line of library code'}"
                            for w, x in pending.items() if x is not None),
          shared=any(x is not None and x.shared for x in pending.values()), poll=polled)
  return []


def _what(wait) -> str:
  what = wait.what() if callable(wait.what) else wait.what
  return f"{'polls' if wait.poll else 'waits for'} {what}"

