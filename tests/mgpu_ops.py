"""JAX's own Mosaic GPU kernels (jax/experimental/pallas/ops/gpu/*_mgpu.py) on pallax, their import
lines switched (and an unused import of JAX's test utilities, which need absl, dropped). Shimmed,
because a CPU machine lacks them: the CUDA version JAX's attention checks
and the SM count JAX's matmul reads from the device."""
import types

import helpers

IMPORTS = {
    "import jax.experimental.pallas as pl": "import pallax as pl",
    "import jax.experimental.pallas.mosaic_gpu as plgpu": "import pallax.mosaic_gpu as plgpu",
    "from jax.experimental import pallas as pl": "import pallax as pl",
    "from jax.experimental.pallas import mosaic_gpu as plgpu": "import pallax.mosaic_gpu as plgpu",
    "from jax._src.lib import cuda_versions  # noqa: F401": "cuda_versions = _CUDA_VERSIONS",
    "from jax._src import test_util as jtu  # noqa: F401": "jtu = None  # unused; it needs absl",
}


class _CudaVersions:
  """A CUDA runtime outside the versions JAX's attention refuses for causal masks."""

  @staticmethod
  def cuda_runtime_get_version():
    return 12090 + 10


def load(name: str, num_sms: int = 2) -> types.ModuleType:
  mod = helpers.load_jax_ops_module(name, IMPORTS, "pallax_mgpu_", strict=False,
                                    _CUDA_VERSIONS=_CudaVersions())
  if hasattr(mod, "get_num_sms"):
    mod.get_num_sms = lambda: num_sms
  return mod
