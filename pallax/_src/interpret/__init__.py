"""The interpret backend: the reference semantics of pallax, with checks."""
