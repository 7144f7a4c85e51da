"""Write a tiny float checkpoint's linears in the on-disk layouts of AutoAWQ (GEMM), AutoGPTQ / GPTQModel,
llm-compressor (compressed-tensors) and DeepSeek-style FP8, with the quantization_config each writes, and
return the float values each layout encodes (dequantized here in numpy, independently of the runtime).

Each `quantize_*` takes one linear's float32 weight w [N, K] (numpy) and returns (tensors: suffix -> torch
tensor, the dequantized float32 [N, K])."""

from __future__ import annotations

import json
import os

import numpy as np
import torch

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's WQLinear_GEMM pack: nibble i holds column ORDER[i] of 8
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def _asym(w: np.ndarray, gs: int, bits: int, zmin: int = 0):
    """Min-max asymmetric codes per group of gs input columns: q [N, K], s [N, G] fp16, z [N, G]."""
    N, K = w.shape
    wg = w.reshape(N, K // gs, gs)
    qmax = (1 << bits) - 1
    lo, hi = np.minimum(wg.min(-1), 0), np.maximum(wg.max(-1), 0)
    s = np.maximum((hi - lo) / qmax, 1e-3).astype(np.float16)
    z = np.clip(np.round(-lo / s.astype(np.float32)), zmin, qmax).astype(np.int64)
    q = np.clip(np.round(wg / s[..., None].astype(np.float32)) + z[..., None], 0, qmax).astype(np.int64)
    return q.reshape(N, K), s, z


def _sym(w: np.ndarray, gs: int, bits: int, scale_dtype=np.float16):
    """Symmetric signed codes per group (gs -1: per output channel): q [N, K] in [-2^(b-1), 2^(b-1) - 1]."""
    N, K = w.shape
    gs = K if gs == -1 else gs
    wg = w.reshape(N, K // gs, gs)
    half = 1 << (bits - 1)
    s = np.maximum(np.abs(wg).max(-1) / (half - 1), 1e-3).astype(scale_dtype)
    q = np.clip(np.round(wg / s[..., None].astype(np.float32)), -half, half - 1).astype(np.int64)
    return q.reshape(N, K), s


def _pack_rows(codes: np.ndarray, bits: int) -> np.ndarray:
    """[R, C] codes -> [R / (32 / bits), C] int32, row r * per + i at bits * i (GPTQ's qweight)."""
    per = 32 // bits
    c = codes.astype(np.uint32).reshape(codes.shape[0] // per, per, codes.shape[1])
    out = np.zeros((c.shape[0], c.shape[2]), np.uint32)
    for i in range(per):
        out |= c[:, i, :] << np.uint32(bits * i)
    return out.view(np.int32)


def _pack_cols(codes: np.ndarray, bits: int, order=None) -> np.ndarray:
    """[R, C] codes -> [R, C / (32 / bits)] int32, column c * per + order[i] at bits * i."""
    per = 32 // bits
    c = codes.astype(np.uint32).reshape(codes.shape[0], codes.shape[1] // per, per)
    if order is not None:
        c = c[:, :, order]
    out = np.zeros(c.shape[:2], np.uint32)
    for i in range(per):
        out |= c[:, :, i] << np.uint32(bits * i)
    return out.view(np.int32)


def quantize_awq(w, gs=32):
    q, s, z = _asym(w, gs, 4)
    g = np.arange(w.shape[1]) // gs
    deq = (q - z[:, g]) * s[:, g].astype(np.float32)
    t = {"qweight": _pack_cols(q.T, 4, AWQ_ORDER), "qzeros": _pack_cols(z.T, 4, AWQ_ORDER), "scales": s.T.copy()}
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in t.items()}, deq.astype(np.float32)


def quantize_gptq(w, gs=32, bits=4, sym=True, perm=None):
    """GPTQ v1 (zeros stored minus one). perm: act order (desc_act): columns quantized in perm's order, so
    g_idx[perm[i]] = i // gs; the codes stay in the original column order."""
    N, K = w.shape
    order = np.arange(K) if perm is None else perm
    wp = w[:, order]
    if sym:
        qs, s = _sym(wp, gs, bits)
        z = np.full(s.shape, 1 << (bits - 1), np.int64)
        qp = qs + z[:, np.arange(K) // gs]
    else:
        qp, s, z = _asym(wp, gs, bits, zmin=1)  # zero 0 would be stored as -1 (v1's known overflow)
    q = np.empty_like(qp)
    q[:, order] = qp
    g_idx = np.empty(K, np.int64)
    g_idx[order] = np.arange(K) // gs
    deq = (q - z[:, g_idx]) * s[:, g_idx].astype(np.float32)
    t = {"qweight": _pack_rows(q.T, bits), "qzeros": _pack_cols(z.T - 1, bits), "scales": s.T.copy(),
         "g_idx": g_idx.astype(np.int32)}
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in t.items()}, deq.astype(np.float32)


def quantize_ct_packed(w, gs=32, bits=4, scale_dtype=np.float32):
    """llm-compressor pack-quantized: codes + 2^(bits-1) packed along the input dim, scales [N, G]."""
    q, s = _sym(w, gs, bits, scale_dtype)
    g = np.arange(w.shape[1]) // (w.shape[1] if gs == -1 else gs)
    deq = q * s[:, g].astype(np.float32)
    t = {"weight_packed": torch.from_numpy(_pack_cols(q + (1 << (bits - 1)), bits)),
         "weight_scale": torch.from_numpy(s.copy()), "weight_shape": torch.tensor(w.shape, dtype=torch.int64)}
    return t, deq.astype(np.float32)


def quantize_fp8(w, block=None, scale_name="weight_scale_inv"):
    """E4M3 weight with float32 scales per block [bn, bk] (ceil-sized grid) or per output channel."""
    N, K = w.shape
    if block is None:
        s = (np.abs(w).max(1, keepdims=True) / 448.0).astype(np.float32)  # [N, 1]
        full = s
    else:
        bn, bk = block
        s = np.zeros((-(-N // bn), -(-K // bk)), np.float32)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                s[i, j] = np.abs(w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]).max() / 448.0
        full = np.repeat(np.repeat(s, bn, 0), bk, 1)[:N, :K]
    f8 = torch.from_numpy(w / full).to(torch.float8_e4m3fn)
    deq = f8.float().numpy() * full
    return {"weight": f8, scale_name: torch.from_numpy(s)}, deq.astype(np.float32)


def write_prequant(path, model, quantize, quant_config: dict, skip=()) -> None:
    """Replace every decoder linear of the checkpoint at path (saved from `model`) by quantize's tensors,
    add quant_config to config.json, and load the dequantized values into `model` (the reference; None: not)."""
    from safetensors.torch import load_file, save_file

    files = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    assert len(files) == 1, files
    tensors = load_file(os.path.join(path, files[0]))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    state = model.state_dict() if model is not None else {}
    for i in range(cfg["num_hidden_layers"]):
        for lin in LINEARS:
            name = f"model.layers.{i}.{lin}"
            if lin in skip:
                continue
            w = tensors.pop(name + ".weight").float().numpy()
            got, deq = quantize(w)
            tensors.update({f"{name}.{k}": v.contiguous() for k, v in got.items()})
            state[name + ".weight"] = torch.from_numpy(deq)
    if model is not None:
        model.load_state_dict(state)
    save_file(tensors, os.path.join(path, files[0]), metadata={"format": "pt"})
    cfg["quantization_config"] = quant_config
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
