"""The Triton backend: kernel jaxpr + GridMapping -> Triton source -> PTX, launched inside XLA."""
