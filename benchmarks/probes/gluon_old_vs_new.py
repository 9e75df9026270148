"""Gluon kernels of whichever pallax comes first on sys.path, for an old-against-new comparison in
one lease: run it twice, ``PALLAX_ROOT=.prev`` (``git archive <commit> pallax | tar -x -C .prev``)
then ``PALLAX_ROOT=$PWD`` (the folder holding ``pallax/`` goes first on sys.path). JAX's warp-specialized matmul (bf16 8192^3, the three tile
configurations of ``hopper_matmul.py``; ``--clusters`` adds the cluster rows) and attention (fp16,
seq 4096, block_kv 128, full and causal); JAX's own kernel in each row is the control for drift."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

def _load_pallax(root: str) -> None:
  """``root/pallax`` as the package ``pallax``, whatever else sys.path or an editable install
  would find first."""
  import importlib.util
  pkg = os.path.join(os.path.abspath(root), "pallax")
  spec = importlib.util.spec_from_file_location("pallax", os.path.join(pkg, "__init__.py"),
                                                submodule_search_locations=[pkg])
  module = importlib.util.module_from_spec(spec)
  sys.modules["pallax"] = module
  spec.loader.exec_module(module)


_load_pallax(os.environ.get("PALLAX_ROOT", "."))

import jax.numpy as jnp  # noqa: E402

import attention_mgpu as attn  # noqa: E402
import hopper_matmul as mm  # noqa: E402
import pallax  # noqa: E402

print("pallax from", os.path.dirname(pallax.__file__), flush=True)
configs = {**mm.CONFIGS, **(mm.CLUSTER_CONFIGS if "--clusters" in sys.argv else {})}
mm.matmul_rows(mm.modules(), jnp.bfloat16, 8192, 8192, 8192, configs)
ams = attn.modules()
for causal in (False, True):
  attn.attention_rows(ams, 4096, 128, causal, 128)
