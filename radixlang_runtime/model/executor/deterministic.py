"""--enable-deterministic-inference: batch-invariant numerics on the CPU path.

Invariant: a greedy request's tokens do not depend on what it is batched with, on prefill chunking,
retraction, the pool size or cache hits. So every operation computes a token's row with arithmetic
that depends on that row alone (and, for attention, on the K/V it reads), never on the batch:

- linears: on VDPBF16PS builds in bf16 and on AVX-512 builds in float32, the dense tiles for every batch
  size (gemv_dense.c: each output is one chain of VDPBF16PS / FMA over the inputs in order, whatever the
  batch or the row's place in it).
  Elsewhere oneDNN's prepacked GEMM (packed_linear.PackedLinear). Measured on this project's Zen 5
  class CPU, bf16 and float32, every weight shape of SmolLM2: for M >= 2 a row's result is
  bit-identical whatever M (2 .. 3000) and wherever the row sits; M = 1 takes another path (float32
  sums ordered differently at K = 1536), so single rows run as two (`pad_single_row`). That is a
  property of the library on a CPU, not a promise, so `enable` probes every distinct weight shape at
  start and refuses the mode (ValueError) when a row's result moves.
- attention: the C extend kernels compute a row from its q and keys 0 .. L-1 alone (row blocks and
  task splits only decide which rows share a pass; keys past a row's length weigh exactly 0). Decode
  rows go through the same kernel (cpu_ops.pool_rows_attention), so a token decoded in a batch
  and the same token recomputed by a prefill after retraction get the same K/V. Cascade attention
  (partial softmaxes merged in an order that depends on the groups) is off.
- norms and activations: the C kernels, one row at a time; rotary embedding and sampling are per
  row already.
- hybrid models' Gated DeltaNet (model/layers/gated_deltanet.py, `enable_deterministic`): the gates, the
  convolution, the delta rule and the gated norm in C, scalar math per element or row (torch's
  transcendental ops round a tensor's vector part and its scalar tail differently, so an element's bits
  would depend on where the batch puts it); prefill runs the decode step's arithmetic token after token, so
  a state is the same bits whether a prefill (a retracted request's recompute) or decode steps built it.
  The gated attention's per-head norms and output gate likewise.

Refused (ValueError naming the reason) where this cannot hold: no C kernels (no compiler, or the
`cc` mask word), linears oneDNN cannot prepack (bf16 on an AVX2-only CPU), quantized weights, tensor
parallelism (server_args), CUDA / the Triton backend, mixture-of-experts models (their expert GEMMs run
on torch's F.linear with a row count that depends on the batch's routing).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from radixlang_kernels.cpu_ops import CpuPaths
from radixlang_runtime.model.layers.packed_linear import PackedLinear

PROBE_BATCHES = ((2, 1), (3, 0), (17, 9), (80, 63))  # (M, position of the probed row)


def enable(model: nn.Module, backend: object, paths: CpuPaths, device: torch.device, dtype: torch.dtype) -> None:
    """Switch `model` and its attention `backend` to batch-invariant numerics, or raise ValueError."""
    cfg = getattr(model, "cfg", None)
    if getattr(cfg, "moe", None) is not None:
        raise ValueError(f"--enable-deterministic-inference is refused: {cfg.architecture}'s expert GEMMs "
                         "(model/layers/moe.py) are not batch-invariant")
    why = None
    if device.type != "cpu":
        why = "it is implemented for the CPU kernels only"
    elif not (paths.c_decode and paths.c_extend and paths.c_norm_act):
        why = f"the C attention / norm kernels are not in use on this machine (paths: {paths.to_dict()})"
    elif not hasattr(backend, "rows_like_extend"):
        why = f"the {type(backend).__name__} attention backend has no batch-invariant mode"
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    if why is None and not linears:
        why = f"its linears are not oneDNN-prepacked here (linear path: {paths.linear})"
    if why is None and hasattr(model, "enable_deterministic"):  # a family's own layers (hybrid: the DeltaNet)
        try:
            model.enable_deterministic()
        except ValueError as e:
            why = str(e)
    if why is None:
        for m in linears:
            m.pad_single_row = True
        backend.cascade = False
        backend.rows_like_extend = True
        moved = probe(linears, dtype)
        if moved is not None:
            why = f"oneDNN's GEMM on this CPU is not batch-invariant: {moved}"
    if why is not None:
        raise ValueError(f"--enable-deterministic-inference is refused: {why}")


def probe(linears: list[PackedLinear], dtype: torch.dtype) -> Optional[str]:
    """For each distinct weight shape: one random row alone, then at another position in batches of
    PROBE_BATCHES; the first batch whose row differs in any bit, or None."""
    g = torch.Generator().manual_seed(0)
    seen: set[tuple[int, int]] = set()
    with torch.inference_mode():
        for lin in linears:
            shape = (lin.out_features, lin.in_features)
            if shape in seen:
                continue
            seen.add(shape)
            x = torch.randn(max(m for m, _ in PROBE_BATCHES), lin.in_features, generator=g).to(dtype)
            alone = lin(x[:1])[0]
            for m, pos in PROBE_BATCHES:
                batch = x[:m].clone()
                batch[[0, pos]] = batch[[pos, 0]]
                if not torch.equal(lin(batch)[pos], alone):
                    return f"weight {shape[0]}x{shape[1]}: a row at position {pos} of {m} differs from the row alone"
    return None
