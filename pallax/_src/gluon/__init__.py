"""The Gluon backend: Mosaic GPU kernels as Gluon source for Hopper (see ``codegen.py``)."""
