"""The op table: the CPU kernels as typed torch-level calls (the runtime's one way into the C library).

Each call here takes tensors, checks what the C side cannot, and calls the entry point of the same name in
csrc/cpu/kernels.h through op_table.OpTable (its signature typed from that header: written once).
- paged_decode (decode_attention.c + decode_impl.h): paged decode attention reading K/V in place;
- extend_causal / shared_prefix / pool_rows_attention (extend_attention.c: VDPBF16PS on AVX512-BF16 builds;
  extend_portable.c + extend_impl.h: any CPU): extend attention, cascade attention's shared part
  (`shared_prefix`: query rows of a group over its shared positions, with log-sum-exp), and decode rows
  through the extend kernel; both decode and extend take that part's result as a prior to merge;
- add_rms_norm, silu_mul (norm_act.c); rope_store (rope_store.c);
- dense_gemv (gemv_dense.c): weight-streaming linears for decode-sized batches, with the tiles they read
  (the quantized ones: quant_ops.py);
- lora_shrink, lora_expand (lora_sgmv.c): LoRA deltas over row segments with per-segment adapters;
- the Gated DeltaNet's entry points (gated_deltanet.c) are wrapped in gdn_ops.py, Mamba2's (mamba2.c) in mamba2_ops.py;
- decode_layer (decode_layer.c): a whole decoder layer of a decode-sized batch in one call, described by
  the header's structs (DecodeLinear, DecodeLayerWeights, DecodeStep).
bf16 and float32 throughout. Which operation runs where is decided once per model by `plan()`: a kernel
is only chosen where its own limits hold, so no chosen kernel can refuse a batch. Without the library
(no compiler, the mask word `cc`, a failed build) every operation runs torch ops.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional, Protocol, Sequence

import torch

from radixlang_kernels.cpu_caps import detect
from radixlang_kernels.op_table import OpTable, build_library, header, pointer_array

_lib: Optional[OpTable] = None
_tried = False

# decode_layer.c's records, as the header declares them (ctypes.Structure classes: fields by name)
DecodeLinear = header().structs["decode_linear"]
DecodeLayerWeights = header().structs["decode_layer_weights"]
DecodeStep = header().structs["decode_step"]


def load() -> Optional[OpTable]:
    """The library for this process's capabilities, or None (every caller then uses torch ops)."""
    global _lib, _tried
    if not _tried:
        _tried = True
        _lib = build_library(detect())
    return _lib


def loaded() -> Optional[OpTable]:
    """The library if load() has built it, else None (a call that may not build it)."""
    return _lib


class CascadeGroups(Protocol):
    """What shared_prefix reads of a cascade plan (the runtime's attention/cascade.py CascadePlan)."""

    group_rows: torch.Tensor  # [G] int64 table row of each group's shared prefix
    group_lens: torch.Tensor  # [G] int64 shared positions
    group_starts: torch.Tensor  # [G + 1] int64 offsets into q_index
    group_counts: torch.Tensor  # [G] int64 query rows per group
    q_index: torch.Tensor  # [E] int64 the grouped query rows


@dataclass(frozen=True)
class CpuPaths:
    """Which implementation runs each operation of a model on this CPU (decided once, at model build).

    "c:<isa>" = a C kernel compiled for that instruction set; "c:<isa>+dpbf16" uses VDPBF16PS;
    "torch:..." = torch ops (the fallback every operation has)."""

    decode_attention: str
    extend_attention: str  # fresh prompts and cached prefixes alike (the kernel reads prefixes in place)
    norm: str
    activation: str
    linear: str
    # hybrid models' recurrent layers: "decode c:<isa>, prefill c:<isa>:recurrent" (Gated DeltaNet), "decode c:<isa>,
    # prefill torch:chunked" (Mamba2)
    linear_attention: str = "none"
    decode_layer: str = "modules"  # "c:<isa> (M <= n)": decode-sized steps in one call per layer (fused_decode.py)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def c_decode(self) -> bool:
        return self.decode_attention.startswith("c:")

    @property
    def c_extend(self) -> bool:
        return self.extend_attention.startswith("c:")

    @property
    def c_norm_act(self) -> bool:
        return self.norm.startswith("c:")


C_MAX_HEAD_DIM, C_MAX_GROUP = 256, 32  # the C attention kernels' limits: head_dim, query heads per KV head


def c_attention_fits(head_dim: int, num_heads: int, num_kv_heads: int) -> bool:
    """Whether the C attention kernels take a layer of this shape (whole GQA groups within their limits)."""
    return head_dim <= C_MAX_HEAD_DIM and num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= C_MAX_GROUP


def plan(device: torch.device, dtype: torch.dtype, head_dim: int, num_heads: int, num_kv_heads: int,
         packed_linears: bool, dense_tiles: bool = False,
         layer_shapes: Optional[Sequence[tuple[int, int]]] = None) -> CpuPaths:
    """The path of each operation. A C kernel is chosen only where the library loaded, the dtype has an
    entry point and the kernel's own limits (D <= 256, H / Hkv <= 32, whole GQA groups) hold.
    layer_shapes: (kv_heads, head_dim) per attention layer where layers differ (Gemma 4): the C attention kernels
    run the layers they fit (at least one must), the torch path the others (the attention paths name both)."""
    linear = "onednn:prepacked" if packed_linears else "torch:F.linear"
    if dense_tiles and dense_any_m(dtype, load()):
        linear = f"c:{detect().isa}+{'dpbf16' if dtype == torch.bfloat16 else 'fma'} dense tiles"
    elif dense_tiles:
        linear += f", c:{detect().isa} dense tiles (M <= {DENSE_MAX_M})"
    if device.type != "cpu":
        return CpuPaths("backend", "backend", "torch", "torch", linear)
    caps = detect()
    shapes = list(layer_shapes) if layer_shapes else [(num_kv_heads, head_dim)]
    fit = {d for h, d in shapes if c_attention_fits(d, num_heads, h)}
    ok = load() is not None and dtype in (torch.bfloat16, torch.float32) and bool(fit)
    isa = caps.isa
    if not ok:
        return CpuPaths("torch:sdpa-gather", "torch:sdpa", "torch", "torch", linear)
    bf16 = dtype == torch.bfloat16
    dp = bf16 and isa == "avx512_bf16" and all(d % 32 == 0 for d in fit)
    decode = f"c:{isa}" + ("+dpbf16" if dp else "")
    extend = f"c:{isa}+dpbf16" if dp else f"c:{isa}:portable"
    slow = sorted({d for h, d in shapes if not c_attention_fits(d, num_heads, h)})  # layers the torch path runs
    if slow:
        dims = ", ".join(str(d) for d in slow)
        decode += f", torch:sdpa-gather (head_dim {dims})"
        extend += f", torch:sdpa (head_dim {dims})"
    norm_act = f"c:{isa}"
    return CpuPaths(decode, extend, norm_act, norm_act, linear)


def check_status(rc: int, name: str) -> None:
    if rc != 0:  # -1: limits (plan() never chooses such a batch); -2: out of memory
        raise RuntimeError(f"CPU kernel {name} failed with code {rc}")


Prior = tuple  # (o [T, H, D] like q, lse [T, H] float32): cascade attention's shared part, merged in


def opt_ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    """t's data pointer, or None (NULL) for no tensor."""
    return None if t is None else t.data_ptr()


def sink_prior(sinks: torch.Tensor, T: int, D: int, dtype: torch.dtype, prior: Optional[Prior] = None) -> Prior:
    """Attention sinks [H] (a learned logit per query head in every row's softmax denominator, weighing no
    value) as a prior the kernels merge by log-sum-exp: value 0, lse = the sink, so each row's output is
    scaled by e^lse / (e^lse + e^sink), its keys' share of the softmax. With `prior` (cascade attention's
    shared part, [T, H, D] and [T, H]) the sink is merged into it (a new pair: the step's prior is rewritten by
    every layer). Returns (o [T, H, D] dtype, lse [T, H] float32)."""
    H = sinks.shape[0]
    s = sinks.float().expand(T, H)
    if prior is None:
        return torch.zeros(T, H, D, dtype=dtype), s.contiguous()
    o, lse = prior
    both = torch.logaddexp(lse, s)  # [T, H]
    return (o.float() * torch.exp(lse - both).unsqueeze(-1)).to(dtype), both


def paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, req_to_token: torch.Tensor,
                 req_rows: torch.Tensor, seq_lens: torch.Tensor, scale: float, k_begin: Optional[torch.Tensor] = None,
                 prior: Optional[Prior] = None, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [B, H, D]; pools [Hkv, N, D]; req_to_token [rows, ctx] int64 -> out [B, H, D]. bf16 or float32.
    k_begin [B] int64: request b attends positions k_begin[b] .. seq_lens[b] - 1 (default 0);
    prior: merged into each row by log-sum-exp (cascade attention's shared part); sinks [H]: attention
    sinks (sink_prior)."""
    q = q.contiguous()
    B, H, D = q.shape
    if sinks is not None:
        prior = sink_prior(sinks, B, D, q.dtype, prior)
    hkv, N, _ = k_pool.shape
    out = torch.empty_like(q)
    name = "paged_decode_bf16" if q.dtype == torch.bfloat16 else "paged_decode_f32"
    po, pl = prior if prior is not None else (None, None)
    rc = getattr(_lib, name)(
        q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), req_to_token.data_ptr(),
        req_rows.data_ptr(), seq_lens.data_ptr(), opt_ptr(k_begin), opt_ptr(po), opt_ptr(pl),
        B, H, hkv, D, N, req_to_token.shape[1], scale, out.data_ptr(),
    )
    check_status(rc, name)
    return out


def mla_decode(q: torch.Tensor, pool: torch.Tensor, req_to_token: torch.Tensor, req_rows: torch.Tensor,
               seq_lens: torch.Tensor, latent_dim: int, scale: float) -> torch.Tensor:
    """Multi-head latent attention decode, absorbed form (mla_decode.c): q [B, H, C + R] (the query in latent
    space, then its roped part), pool [N, C + R] (one layer's entries: latent then roped key; the values are the
    latents), req_to_token [rows, ctx] int64, req_rows / seq_lens [B] int64 -> out [B, H, C], C = latent_dim.
    bf16 or float32, q and pool of one dtype."""
    q, pool = q.contiguous(), pool.contiguous()
    B, H, E = q.shape
    out = q.new_empty(B, H, latent_dim)
    name = "mla_decode_bf16" if q.dtype == torch.bfloat16 else "mla_decode_f32"
    rc = getattr(_lib, name)(q.data_ptr(), pool.data_ptr(), req_to_token.data_ptr(), req_rows.data_ptr(),
                             seq_lens.data_ptr(), B, H, latent_dim, E - latent_dim, pool.shape[0],
                             req_to_token.shape[1], scale, out.data_ptr())
    check_status(rc, name)
    return out


def add_rms_norm(x: Optional[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual [T, H] += x (in place, when x is given); returns rms_norm(residual) * weight.
    All bf16 or all float32; residual contiguous."""
    T, H = residual.shape
    out = torch.empty_like(residual)
    xp = None if x is None else x.contiguous().data_ptr()
    fn = _lib.add_rms_norm_bf16 if residual.dtype == torch.bfloat16 else _lib.add_rms_norm_f32
    fn(residual.data_ptr(), xp, weight.data_ptr(), out.data_ptr(), T, H, eps)
    return out


def rope_store(qkv: torch.Tensor, cos: Optional[torch.Tensor], sin: Optional[torch.Tensor], H: int, Hkv: int, D: int,
               out_loc: Optional[torch.Tensor] = None, k_pool: Optional[torch.Tensor] = None,
               v_pool: Optional[torch.Tensor] = None) -> None:
    """In place: neox rope on the q and k heads of qkv [T, (H + 2 Hkv) D] (rows contiguous, any row stride),
    as Rotary.apply rounds it; then, with out_loc [T] int64 and pools [Hkv, N, D], each row's k and v heads
    into the pools (KVPool.store). cos [T, D], sin [T, D / 2] contiguous (Rotary.cos_sin); both None: no
    rotary (a NoPE layer), the store only. One dtype, bf16 or float32 (rope_store.c)."""
    T = qkv.shape[0]
    assert qkv.stride(1) == 1 and qkv.shape[1] >= (H + 2 * Hkv) * D
    assert (cos is None) == (sin is None)
    if cos is not None:
        assert cos.is_contiguous() and sin.is_contiguous() and cos.dtype == sin.dtype == qkv.dtype
    fn = _lib.rope_store_bf16 if qkv.dtype == torch.bfloat16 else _lib.rope_store_f32
    N = 0 if k_pool is None else k_pool.shape[1]
    fn(qkv.data_ptr(), T, qkv.stride(0), H, Hkv, D, opt_ptr(cos), opt_ptr(sin), opt_ptr(out_loc),
       opt_ptr(k_pool), opt_ptr(v_pool), N)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] bf16 or float32 -> silu(gate) * up [T, I]."""
    T, two_i = gate_up.shape
    out = torch.empty(T, two_i // 2, dtype=gate_up.dtype)
    fn = _lib.silu_mul_bf16 if gate_up.dtype == torch.bfloat16 else _lib.silu_mul_f32
    fn(gate_up.contiguous().data_ptr(), out.data_ptr(), T, two_i // 2)
    return out


DENSE_MAX_M = 16  # gemv_dense.c's limit, except dense_any_m
DENSE_TILE = 32  # output rows per tile (gemv_dense.c's TILE)


def dense_tiles(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] bf16 (K even) or float32 -> gemv_dense.c's tiled copy: bf16 [NT, K/2, 32, 2],
    float32 [NT, K, 32], NT = ceil(N / 32), the last tile's missing rows zero."""
    N, K = weight.shape
    nt = -(-N // DENSE_TILE)
    if N % DENSE_TILE:
        w = torch.zeros(nt * DENSE_TILE, K, dtype=weight.dtype)
        w[:N] = weight.detach()
    else:  # whole tiles: no padded copy
        w = weight.detach().contiguous()
    if weight.dtype == torch.bfloat16:
        if K % 2:
            raise ValueError(f"bf16 dense tiles need an even K, got {K}")
        if w.storage_offset() % 2:
            w = w.clone()
        # a bf16 pair moves as one int32: the same bytes as permuting [NT, 32, K/2, 2] to [NT, K/2, 32, 2]
        pairs = w.view(torch.int32).view(nt, DENSE_TILE, K // 2).transpose(1, 2).contiguous()
        return pairs.view(torch.bfloat16).view(nt, K // 2, DENSE_TILE, 2)
    if weight.dtype != torch.float32:
        raise ValueError(f"dense tiles are bf16 or float32, got {weight.dtype}")
    return w.view(nt, DENSE_TILE, K).permute(0, 2, 1).contiguous()


def dense_any_m(dtype: torch.dtype, lib: Optional[OpTable] = None) -> bool:
    """dense_gemv takes any batch size for `dtype` with the loaded library: bf16 on VDPBF16PS builds and
    float32 on AVX-512 builds, whose GEMM micro-kernel matches oneDNN's packed GEMM at large M and beats
    it below (docs/PERFORMANCE.md#cpu-linears), so such weights need no oneDNN copy."""
    lib = lib or _lib
    if lib is None or dtype not in (torch.bfloat16, torch.float32):
        return False
    return bool(lib.dense_any_m_bf16() if dtype == torch.bfloat16 else lib.dense_any_m_f32())


def dense_gemv(x: torch.Tensor, tiles: torch.Tensor, n_out: int, bias: Optional[torch.Tensor] = None,
               portable: bool = False, lib: Optional[OpTable] = None) -> Optional[torch.Tensor]:
    """x [M, K] (rows may be strided) @ W.T (+ bias) -> [M, n_out] like x, W given as dense_tiles(W) of
    x's dtype; None when the library is not loaded or M > DENSE_MAX_M without dense_any_m (the caller's
    GEMM runs). portable: the bf16 body without VDPBF16PS (tests run both)."""
    lib = lib or _lib
    M, K = x.shape
    if lib is None or M == 0 or (M > DENSE_MAX_M and (portable or not dense_any_m(x.dtype, lib))):
        return None
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(M, n_out, dtype=x.dtype)
    if x.dtype == torch.bfloat16:
        name = "dense_gemv_portable_bf16" if portable else "dense_gemv_bf16"
    else:
        name = "dense_gemv_f32"
    rc = getattr(lib, name)(x.data_ptr(), x.stride(0), tiles.data_ptr(), opt_ptr(bias), out.data_ptr(), M, K, n_out)
    check_status(rc, name)
    return out


def _heads_contiguous(t: torch.Tensor) -> torch.Tensor:
    D = t.shape[2]
    return t if t.stride(2) == 1 and t.stride(1) == D else t.contiguous()


def _extend_call(q: torch.Tensor, kv: Optional[tuple], starts: torch.Tensor, lens: torch.Tensor, hkv: int,
                 scale: float, prefix: Optional["PagedPrefix"], dpbf16: bool, out: torch.Tensor,
                 q_index: Optional[torch.Tensor] = None, lse_out: Optional[torch.Tensor] = None,
                 prior: Optional[Prior] = None, window: int = 0) -> None:
    """The one caller of the extend kernels' segment contract (extend_attention.c); window > 0: each row
    sees the keys at positions (p - window, p] of its query's position p (common.h window_first_key)."""
    T, H, D = q.shape
    q = _heads_contiguous(q)
    k, v = (None, None) if kv is None else (_heads_contiguous(kv[0]), _heads_contiguous(kv[1]))
    if prefix is None:
        pool_args = (None, None, 0, None, 0, None, None, None)
    else:
        rt = prefix.req_to_token
        pool_args = (prefix.k_pool.data_ptr(), prefix.v_pool.data_ptr(), prefix.k_pool.shape[1], rt.data_ptr(),
                     rt.stride(0), prefix.req_rows.data_ptr(), prefix.prefix_lens.data_ptr(), opt_ptr(prefix.k_begin))
    if q.dtype == torch.float32:
        name = "extend_causal_f32"
    else:
        name = "extend_causal_bf16" if dpbf16 else "extend_causal_portable_bf16"
    po, pl = prior if prior is not None else (None, None)
    rc = getattr(_lib, name)(q.data_ptr(), q.stride(0), opt_ptr(k), 0 if k is None else k.stride(0), opt_ptr(v),
                             0 if v is None else v.stride(0), starts.data_ptr(), lens.data_ptr(), lens.shape[0],
                             H, hkv, D, scale, out.data_ptr(), *pool_args, opt_ptr(q_index), opt_ptr(lse_out),
                             opt_ptr(po), opt_ptr(pl), window)
    check_status(rc, name)


def extend_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor,
                  scale: float, prefix: Optional["PagedPrefix"] = None, dpbf16: bool = False,
                  prior: Optional[Prior] = None, window: int = 0, sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Extend attention: new tokens attend to their cached prefix (if any) and causally to themselves
    (window > 0: only to the keys at positions (p - window, p] of the query's position p; sinks [H]: attention
    sinks, sink_prior).

    q [T, H, D], k / v [T, Hkv, D] (the new tokens; bf16 or float32), heads contiguous (row strides may
    differ; other layouts are copied); starts / lens [R] int64 -> out [T, H * D].
    prefix: where each request's positions prefix.k_begin[r] (default 0) .. prefix_lens[r] - 1 live in
    the pool (None: no prefixes). prior: merged into each row (cascade attention's shared part).
    dpbf16: the VDPBF16PS kernel (plan() sets it only on AVX512-BF16 builds, bf16, D % 32 == 0).
    """
    T, H, D = q.shape
    out = torch.empty(T, H * D, dtype=q.dtype)
    if sinks is not None:
        prior = sink_prior(sinks, T, D, q.dtype, prior)
    _extend_call(q, (k, v), starts, lens, k.shape[1], scale, prefix, dpbf16, out, prior=prior, window=window)
    return out


def empty_prior(T: int, H: int, D: int, dtype: torch.dtype) -> Prior:
    """A prior that weighs nothing: o zeros [T, H, D], lse -inf [T, H] float32 (shared_prefix fills the
    grouped rows; one per step serves every layer, as each layer rewrites the same rows)."""
    return torch.zeros(T, H, D, dtype=dtype), torch.full((T, H), float("-inf"), dtype=torch.float32)


def shared_prefix(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, req_to_token: torch.Tensor,
                  plan: CascadeGroups, scale: float, dpbf16: bool, prior: Prior) -> None:
    """Cascade attention's shared part (attention/cascade.py): every row of q [T, H, D] listed in
    plan.q_index attends to positions 0 .. P_g - 1 of its group's table row, no causal mask; its
    output and log-sum-exp go into those rows of `prior` (empty_prior), the other rows are untouched."""
    prefix = PagedPrefix(k_pool, v_pool, req_to_token, plan.group_rows, plan.group_lens)
    _extend_call(q, None, plan.group_starts, plan.group_counts, k_pool.shape[0], scale, prefix, dpbf16, prior[0],
                 q_index=plan.q_index, lse_out=prior[1])


def pool_rows_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, req_to_token: torch.Tensor,
                        req_rows: torch.Tensor, seq_lens: torch.Tensor, rows: torch.Tensor, ones: torch.Tensor,
                        scale: float, dpbf16: bool = False, window: int = 0,
                        sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Decode through the extend kernel: row b of q [B, H, D] attends to positions 0 .. seq_lens[b] - 1
    of table row req_rows[b], all in the pool (rows = arange(B), ones = [1] * B: one segment per row);
    window > 0: only the last `window` of them, masked in place as a prefill masks them.
    Each row gets exactly the arithmetic an extend gives the same token (the deterministic mode: a
    token's output never depends on which kernel ran it)."""
    out = torch.empty_like(q)
    prefix = PagedPrefix(k_pool, v_pool, req_to_token, req_rows, seq_lens)
    prior = None if sinks is None else sink_prior(sinks, q.shape[0], q.shape[2], q.dtype)
    _extend_call(q, None, rows, ones, k_pool.shape[0], scale, prefix, dpbf16, out, prior=prior, window=window)
    return out


@dataclass
class PagedPrefix:
    """The cached prefixes of an extend batch, read in place from the pool."""

    k_pool: torch.Tensor  # [Hkv, N, D] bf16 or float32, contiguous (one layer)
    v_pool: torch.Tensor  # [Hkv, N, D]
    req_to_token: torch.Tensor  # [rows, ctx] int64, contiguous rows
    req_rows: torch.Tensor  # [R] int64
    prefix_lens: torch.Tensor  # [R] int64
    k_begin: Optional[torch.Tensor] = None  # [R] int64 first prefix position read (cascade's own part); None: 0


def decode_layer_pools(pool: Any) -> tuple[Any, Any]:
    """DecodeStep.k_pools / v_pools for a KV pool with per-layer k_buffers / v_buffers [Hkv, slots, D]
    (keep the pair alive while a step uses it)."""
    return (pointer_array([b.data_ptr() for b in pool.k_buffers]),
            pointer_array([b.data_ptr() for b in pool.v_buffers]))


def decode_layers(weights: list, step: Any, residual: torch.Tensor) -> torch.Tensor:
    """decode_layer.c over every layer of `weights` (DecodeLayerWeights) for one DecodeStep: residual
    [M, hidden] updated in place; returns the last layer's MLP output [M, hidden] (like residual)."""
    fn = _lib.decode_layer_bf16 if residual.dtype == torch.bfloat16 else _lib.decode_layer_f32
    M, hidden = residual.shape
    bufs = [torch.empty(M, hidden, dtype=residual.dtype) for _ in range(2)]  # [M, hidden] each, alternating
    h: Optional[torch.Tensor] = None
    res = residual.data_ptr()
    for i, w in enumerate(weights):
        out = bufs[i % 2]
        rc = fn(w, step, res, None if h is None else h.data_ptr(), out.data_ptr())
        if rc:
            raise RuntimeError(f"CPU kernel decode_layer failed with code {rc} (layer {i})")
        h = out
    return h


def lora_shrink(x: torch.Tensor, rows: torch.Tensor, seg_starts: torch.Tensor, a_ptrs: Any, ranks: torch.Tensor,
                t: torch.Tensor) -> None:
    """LoRA shrink over row segments (lora_sgmv.c): t[j, :ranks[s]] = x[rows[j]] @ A_s^T for j in segment s.
    x [T, K] bf16 or float32 (rows contiguous), rows / seg_starts / ranks int64, a_ptrs: pointer_array of the
    S contiguous A_s [ranks[s], K] like x, t [R, ts] float32 written."""
    name = "lora_shrink_bf16" if x.dtype == torch.bfloat16 else "lora_shrink_f32"
    rc = getattr(_lib, name)(x.data_ptr(), x.stride(0), rows.data_ptr(), seg_starts.data_ptr(), ranks.shape[0],
                              a_ptrs, ranks.data_ptr(), x.shape[1], t.data_ptr(), t.stride(0))
    check_status(rc, name)


def lora_expand(t: torch.Tensor, rows: torch.Tensor, seg_starts: torch.Tensor, tasks: torch.Tensor, b_ptrs: Any,
                y: torch.Tensor) -> None:
    """LoRA expand (lora_sgmv.c), in place: per task (tasks [NT, 5] int64: segment, column in t, rank r,
    output offset, width n) y[rows[j], off:off + n] += t[j, col:col + r] @ Bt (b_ptrs: the NT contiguous
    Bt [r, n] like y, the scaling folded in). t float32; y bf16 or float32, rows contiguous."""
    name = "lora_expand_bf16" if y.dtype == torch.bfloat16 else "lora_expand_f32"
    rc = getattr(_lib, name)(t.data_ptr(), t.stride(0), rows.data_ptr(), seg_starts.data_ptr(), tasks.data_ptr(),
                              tasks.shape[0], b_ptrs, y.data_ptr(), y.stride(0))
    check_status(rc, name)
