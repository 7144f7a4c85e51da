"""radixlang's kernels, importing nothing of the runtime (docs/KERNELS.md).

- Triton (GPU; interpreted on CPU with TRITON_INTERPRET=1): decode_attention, extend_attention,
  prefix_attention (cascade's shared part), on triton_common's shared loops; mla_decode_triton (latent
  attention's absorbed decode);
- reference.py: the plain-torch reference every attention kernel is tested against;
- C for the CPU (csrc/cpu/, one header kernels.h declaring every entry point): cpu_ops, the op table the
  runtime calls; op_table builds, caches and loads the library, typing each call from the header
  (header.py's strict prototype parser); cpu_caps decides what this CPU runs (RADIXLANG_CPU_MASK).
"""
