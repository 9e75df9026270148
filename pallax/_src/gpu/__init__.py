"""Shared by the GPU backends: rewrites of kernel jaxprs (legalization, tiling) and the kernel plan."""
