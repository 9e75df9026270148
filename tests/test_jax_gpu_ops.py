"""JAX's own Pallas GPU ops run on pallax, imports aside: in the interpreter (against plain JAX)
and lowered to Triton PTX."""
import jax
import numpy as np
import pytest

import pallax.triton as plgpu
from jax_gpu_ops import cases, load

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_interpreter_runs_jax_gpu_op(case):
  name, module, build, args, ref = case
  m = load(module)
  got = build(m, True)(*args)
  if ref is None:
    ref = m.mha_reference(*args, segment_ids=None)
  err = np.linalg.norm(np.asarray(got) - np.asarray(ref)) / np.linalg.norm(np.asarray(ref))
  assert err < 1e-5, err


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_jax_gpu_op_lowers_to_ptx(case):
  name, module, build, args, _ = case
  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
  arts = plgpu.lower(build(load(module), False), *specs, compute_capability=90)
  assert arts and all(".entry" in a.ptx for a in arts)
