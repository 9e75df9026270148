"""The PyTorch entry point: ``as_torch_kernel`` (``kernel.py``), its plan of torch steps on a CUDA device
(``plan.py``), kernel launches (``launch.py``), torch equivalents of the other primitives (``rules.py``) and
gradients (``autograd.py``)."""
