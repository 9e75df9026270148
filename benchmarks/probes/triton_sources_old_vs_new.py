"""Do the Triton benchmark kernels (``benchmarks/triton_vs_pallas.py``) compile to the same source
and PTX with an earlier pallax? Needs no GPU. Identical PTX needs no timing; a difference is what
``pallax_vs_previous.py`` must time on the GPU. The PTX hash leaves out debug information and
``.loc`` lines: a generated source that only moved lines compiles to the same instructions.

``python benchmarks/probes/triton_sources_old_vs_new.py DIR`` prints, per kernel, hashes of its
source and PTX for ``DIR/pallax``; run it for the old and the new tree and compare."""
import os, sys, importlib.util, hashlib
root = os.path.abspath(sys.argv[1])
pkg = os.path.join(root, "pallax")
spec = importlib.util.spec_from_file_location("pallax", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg])
m = importlib.util.module_from_spec(spec); sys.modules["pallax"] = m; spec.loader.exec_module(m)
import pallax, pallax.triton as T
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax, jax.numpy as jnp
import triton_vs_pallas as tvp
S = lambda *s, d=jnp.bfloat16: jax.ShapeDtypeStruct(s, d)
cases = {
 "matmul": (lambda a, b: tvp.blocked_matmul(pallax, T.CompilerParams, a, b), (S(1024,1024), S(1024,1024))),
 "attn": (lambda q, k, v: tvp.flash_attention(pallax, T.CompilerParams, q, k, v, False), (S(2,512,128),)*3),
 "attn_causal": (lambda q, k, v: tvp.flash_attention(pallax, T.CompilerParams, q, k, v, True), (S(2,512,128),)*3),
 "layer_norm": (lambda x, w, b: tvp.layer_norm(pallax, T.CompilerParams, x, w, b), (S(1024,8192,d=jnp.float32), S(1,8192,d=jnp.float32), S(1,8192,d=jnp.float32))),
 "softmax": (lambda x: tvp.softmax(pallax, T.CompilerParams, x), (S(1024,8192,d=jnp.float32),)),
 "notebook": (lambda a, b: tvp.notebook_matmul(pallax, T.CompilerParams, a, b), (S(1024,1024,d=jnp.float32), S(1024,1024,d=jnp.float32))),
}
for name, (f, args) in cases.items():
  for k in T.lower(f, *args):
    src = getattr(k, "source", "")
    code = [l for l in k.ptx.split(".section")[0].splitlines()
            if not l.strip().startswith((".loc", "//", "$L__")) and ".file" not in l]
    print(name, hashlib.sha256(src.encode()).hexdigest()[:16],
          hashlib.sha256("\n".join(code).encode()).hexdigest()[:16])
