"""A .gguf model served on its own blocks (model/layers/gguf_block_linear.py): a tiny llama written with every block
type the kernels read (tests/gguf_tiny.py; legacy types quantized by gguf.quants, K-quants / IQ4 as random
blocks) and a Q4_K_M-like mix. float32: greedy tokens equal transformers' on the same dequantized weights;
resident weight bytes stay within 1.2x the file's tensor bytes; bf16 decode runs gemv_kquant.c. The default
for a .gguf --model-path (gguf_mode.resolve_quantization) and `--quantization none` are checked on their own."""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace

import numpy as np
import pytest

from gguf_tiny import blocks_like, convert_tiny, gguf_tensors, write_gguf
from radixlang_kernels import cpu_ops, quant_ops
from radixlang_runtime.model.loader.gguf_convert import cache_key
from tiny_checkpoints import build_tiny, hf_greedy

PROMPTS = [list(range(300, 320)), [5, 77, 1200, 9, 4000, 31]]
NEW = 8
TINY = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
            initializer_range=0.3, max_position_embeddings=256)
# every type the kernels read, one per tensor (q / k / v and gate / up fuse across types)
EVERY_TYPE = {0: ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K"),
              1: ("Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q4_K", "Q6_K")}
# llama.cpp's Q4_K_M: Q4_K layers, Q6_K for v / down, fallbacks Q5_0 / Q8_0 (o_proj: gguf_linear's Q8_0 tiles)
Q4_K_M = {0: ("Q4_K", "Q4_K", "Q6_K", "Q8_0", "Q4_K", "Q4_K", "Q6_K"),
          1: ("Q4_K", "Q4_K", "Q5_0", "Q8_0", "Q4_K", "Q4_K", "Q5_0")}
SUFFIXES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
# the embedding (tied head): Q6_K, and Q8_0 as llama.cpp's Q4_K_M stores a tied embedding whose width is not a
# multiple of 256 (SmolLM2's 576)
FILES = {"every_type": (EVERY_TYPE, "Q6_K"), "q4_k_m": (Q4_K_M, "Q8_0")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """name -> (converted dir, .gguf path, the transformers model on the dequantized weights)."""
    import torch

    root = tmp_path_factory.mktemp("gguf_blocks")
    model = build_tiny(root / "hf", "LlamaConfig", TINY, {})
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    tensors = gguf_tensors(state, "llama", 4, 2)
    out = {}
    for name, (layers, embed) in FILES.items():
        kinds = {"token_embd.weight": (embed, blocks_like(embed, tensors["token_embd.weight"], seed=99))}
        for i, types in layers.items():
            for j, (suffix, kind) in enumerate(zip(SUFFIXES, types)):
                gname = f"blk.{i}.{suffix}.weight"
                kinds[gname] = (kind, blocks_like(kind, tensors[gname], seed=10 * i + j))
        path = str(root / f"{name}.gguf")
        write_gguf(path, "llama", model.config, state, kinds=kinds)
        model_dir = os.path.join(str(root / "cache"), cache_key(path))  # where Engine(path) finds its conversion
        got = convert_tiny(path, model_dir, str(root / "hf"))
        ref = copy.deepcopy(model)
        ref.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in got.items()}, strict=False)
        out[name] = (model_dir, path, ref)
    return out


def _file_tensor_bytes(path: str) -> int:
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)


def _block_types(model) -> set[str]:
    from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear, GGUFEmbedding
    from radixlang_runtime.model.layers.gguf_linear import GGUFLinear

    types = set()
    for m in model.modules():
        if isinstance(m, GGUFBlockLinear):
            types.update(m.fmts)
        elif isinstance(m, (GGUFLinear, GGUFEmbedding)):
            types.add(m.fmt)
    return types


def _greedy(eng) -> list[list[int]]:
    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    return [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=sp)]


@pytest.mark.parametrize("name", sorted(FILES))
def test_float32_on_blocks_equals_transformers_within_file_bytes(tiny, name):
    """every_type: the .gguf path itself (its blocks by default); q4_k_m: its conversion with the flag."""
    from torch import nn

    from radixlang_runtime import Engine

    model_dir, path, ref = tiny[name]
    want = [hf_greedy(ref, p, NEW) for p in PROMPTS]
    layers, embed = FILES[name]
    how = (dict(model_path=path, model_cache_dir=os.path.dirname(model_dir)) if name == "every_type"
           else dict(model_path=model_dir, quantization="gguf"))
    with Engine(dtype="float32", max_total_tokens=1024, model_impl="native", **how) as eng:
        assert eng.runner.args.quantization == "gguf"
        model = eng.runner.model
        assert _block_types(model) == {embed, *(t for types in layers.values() for t in types)}
        assert not [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]
        assert _greedy(eng) == want
        resident, file_bytes = eng.runner.weights_bytes, _file_tensor_bytes(path)
    assert resident <= 1.2 * file_bytes, (resident, file_bytes)


def _count_calls(monkeypatch, *names: str) -> dict[str, list[tuple[int, str]]]:
    """name -> (rows of x, block type) of each call of these quant_ops kernels from here on."""
    calls: dict[str, list[tuple[int, str]]] = {name: [] for name in names}

    def counting(name):
        kernel = getattr(quant_ops, name)

        def counted(x, w, fmt, *args, **kwargs):
            calls[name].append((x.shape[0], fmt))
            return kernel(x, w, fmt, *args, **kwargs)
        return counted

    for name in names:
        monkeypatch.setattr(quant_ops, name, counting(name))
    return calls


def test_bf16_decode_runs_the_block_kernel(tiny, monkeypatch):
    from radixlang_runtime import Engine

    if cpu_ops.load() is None:
        pytest.skip("no C compiler: the blocks are dequantized per tile")
    calls = _count_calls(monkeypatch, "gguf_kq_gemv", "gguf_q8_gemv")
    model_dir, path, _ = tiny["every_type"]
    with Engine(model_dir, dtype="bfloat16", quantization="gguf", max_total_tokens=1024, model_impl="native") as eng:
        assert eng.runner.model.fused_decode is not None
        eng.runner.model.fused_decode = None  # the modules' kernels (decode_layer.c's: bit-identical, below)
        outs = _greedy(eng)
        resident = eng.runner.weights_bytes
    assert [len(o) for o in outs] == [NEW] * len(PROMPTS)
    # decode steps, the kernels' batches: Q4_1 / Q5_0 / Q8_0 parts on gemv_q8.c's tiles, the rest on the blocks
    decoded = {name: {fmt for m, fmt in c if m <= len(PROMPTS)} for name, c in calls.items()}
    layers = {t for types in EVERY_TYPE.values() for t in types}
    assert decoded["gguf_q8_gemv"] == layers & set(quant_ops.Q8_TILE_FORMATS)
    assert decoded["gguf_kq_gemv"] == (layers - set(quant_ops.Q8_TILE_FORMATS)) | {"Q6_K"}  # + the tied head
    assert resident <= 1.2 * _file_tensor_bytes(path)


def test_bf16_tied_head_and_embedding_hold_one_copy_and_batches_run_the_int8_gemm(tiny, monkeypatch):
    """A bf16 server on a Q4_K_M-like file: the tied Q8_0 head keeps the int8 tiles its decode kernel reads and
    the embedding reads its rows back from them (one copy: weights within 1.2x the file), and the prefill batch
    (above KQ_MAX_M rows) runs gemm_kquant.c on the blocks' types and on the tiles of the tiled ones."""
    import torch

    from radixlang_runtime import Engine
    from radixlang_runtime.model.layers.gguf_linear import GGUFLinear, GGUFTiedEmbedding

    if cpu_ops.load() is None:
        pytest.skip("no C compiler: the blocks are dequantized per tile")
    calls = _count_calls(monkeypatch, "gguf_kq_gemm", "gguf_q8_tiles_gemm")
    model_dir, path, _ = tiny["q4_k_m"]
    with Engine(model_dir, dtype="bfloat16", quantization="gguf", max_total_tokens=1024, model_impl="native") as eng:
        outs = _greedy(eng)
        model = eng.runner.model
        assert isinstance(model.head, GGUFLinear) and model.head.fmt == "Q8_0" and model.head.tiles is not None
        assert isinstance(model.embed_tokens, GGUFTiedEmbedding) and model.embed_tokens.head[0] is model.head
        resident = eng.runner.weights_bytes
        seen = len(calls["gguf_q8_tiles_gemm"])  # a vocabulary's rows stay on gemv_q8.c through its 16 rows
        model.head(torch.randn(quant_ops.KQ_MAX_M, model.head.in_features).to(torch.bfloat16))
        assert model.head.out_features > quant_ops.KQ_TILES_GEMM_MAX_N and len(calls["gguf_q8_tiles_gemm"]) == seen
    assert [len(o) for o in outs] == [NEW] * len(PROMPTS)
    assert resident <= 1.2 * _file_tensor_bytes(path), (resident, _file_tensor_bytes(path))
    prefill = sum(len(p) for p in PROMPTS)
    every = {t for types in Q4_K_M.values() for t in types}
    assert quant_ops.KQ_MAX_M < prefill <= quant_ops.KQ_GEMM_MAX_M
    assert {fmt for m, fmt in calls["gguf_kq_gemm"] if m == prefill} == every - set(quant_ops.Q8_TILE_FORMATS)
    # o_proj (one Q8_0 part: a GGUFLinear) and the rest on their tiles, no copy back into the file's layout
    assert {fmt for m, fmt in calls["gguf_q8_tiles_gemm"] if m == prefill} == every & set(quant_ops.Q8_TILE_FORMATS)


def test_quantization_none_keeps_the_dequantized_weights(tiny):
    from torch import nn

    from radixlang_runtime import Engine

    model_dir, path, ref = tiny["q4_k_m"]
    with Engine(path, model_cache_dir=os.path.dirname(model_dir), quantization="none", dtype="float32",
                max_total_tokens=1024, model_impl="native") as eng:
        assert eng.runner.args.quantization is None
        assert _block_types(eng.runner.model) == set()
        assert isinstance(eng.runner.model.embed_tokens, nn.Embedding)
        assert _greedy(eng) == [hf_greedy(ref, p, NEW) for p in PROMPTS]


def _args(**kw):
    base = dict(quantization=None, model_path=None, tp_size=1, is_embedding=False,
                enable_deterministic_inference=False)
    return SimpleNamespace(**{**base, **kw})


def test_a_gguf_model_path_defaults_to_its_blocks(tiny):
    from radixlang_runtime.model.loader.gguf_mode import resolve_quantization
    from radixlang_runtime.model.models.llama import LlamaForCausalLM

    model_dir, path, _ = tiny["q4_k_m"]
    llama = LlamaForCausalLM
    assert resolve_quantization(_args(model_path=path), model_dir, llama, "cpu") == "gguf"
    assert resolve_quantization(_args(model_path=path, quantization="none"), model_dir, llama, "cpu") is None
    assert resolve_quantization(_args(model_path=path, quantization="int8"), model_dir, llama, "cpu") == "int8"
    assert resolve_quantization(_args(model_path=model_dir), model_dir, llama, "cpu") is None  # a directory
    assert resolve_quantization(_args(model_path=path, is_embedding=True), model_dir, llama, "cpu") is None
    assert resolve_quantization(_args(model_path=path), model_dir, llama, "cuda") is None
    other = os.path.join(os.path.dirname(path), "every_type.gguf")  # a draft beside another .gguf
    assert resolve_quantization(_args(model_path=other), model_dir, llama, "cpu") is None


def test_quantization_values_are_checked_by_name():
    from radixlang_runtime.server_args import ServerArgs

    assert ServerArgs(quantization="none").quantization == "none"
    with pytest.raises(ValueError, match="'q4_k_m'.*int8.*none.*gguf"):
        ServerArgs(quantization="q4_k_m")


def test_blocks_outside_the_supported_types_are_refused_by_name():
    import torch

    from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear

    with pytest.raises(ValueError, match="IQ2_XXS is not supported on its blocks .*Q4_0, Q4_1.*IQ4_XS"):
        GGUFBlockLinear([(torch.zeros(4, 66, dtype=torch.uint8), "IQ2_XXS")], 256, None, torch.float32)
    with pytest.raises(ValueError, match=r"Q4_K blocks \(4, 100\) do not hold rows of 256 weights"):
        GGUFBlockLinear([(torch.zeros(4, 100, dtype=torch.uint8), "Q4_K")], 256, None, torch.float32)


def test_large_batches_dequantize_tiles_to_the_exact_product(monkeypatch):
    """M above the kernels' limit: tiles of rows (several per part here) and a GEMM over gguf.quants' values."""
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from radixlang_kernels.testing import random_gguf_blocks
    from radixlang_runtime.model.layers import gguf_block_linear
    from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear

    rng = np.random.default_rng(0)
    parts = [(torch.from_numpy(random_gguf_blocks(f, n, 256, 0.05, rng)), f) for f, n in (("Q4_K", 40), ("Q5_0", 24))]
    w = np.concatenate([dequantize(b.numpy(), GGMLQuantizationType[f]) for b, f in parts])  # [64, 256]
    bias = torch.randn(64)
    lin = GGUFBlockLinear(parts, 256, bias, torch.float32)
    x = torch.randn(quant_ops.KQ_EXACT_MAX_M + 3, 256)
    monkeypatch.setattr(gguf_block_linear, "TILE_BYTES", 256 * 4 * 16)  # 16 rows a tile
    y = lin(x)
    torch.testing.assert_close(y, x @ torch.from_numpy(w).T + bias, rtol=1e-5, atol=1e-5)
    y1 = lin(x[:1])  # a decode row: the exact float32 kernel (or the tiles without the library)
    torch.testing.assert_close(y1, x[:1] @ torch.from_numpy(w).T + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q5_0", "Q8_0"])
def test_q8_tiles_go_back_to_the_files_blocks_exactly(fmt):
    """gemv_q8.c's tiles hold the file's bytes, moved: the inverse gives the blocks back, whole or by rows."""
    import torch

    from radixlang_kernels.testing import random_gguf_blocks

    N, K = 13, 32 * 7  # a partial 4-row tile and an odd count of 32-blocks per row
    blocks = torch.from_numpy(random_gguf_blocks(fmt, N, K, 0.05, np.random.default_rng(1)))
    tiles = quant_ops.gguf_q8_tiles(blocks, fmt)
    assert torch.equal(quant_ops.gguf_q8_untiles(tiles, fmt, N, K), blocks)
    rows = torch.tensor([12, 0, 5, 5, 3, 8])  # the partial tile's row, repeats, every row position in a tile
    assert torch.equal(quant_ops.gguf_q8_untiles(tiles, fmt, N, K, rows=rows), blocks[rows])


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
def test_bf16_q8_tiles_serve_large_batches_without_a_dense_copy(fmt):
    """gguf_linear's bf16 tiles go back to the file's layout exactly, and a batch above the tiles' kernel runs
    the dequantized tiles (bf16 weights: gguf.quants' values rounded once)."""
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from radixlang_kernels.testing import random_gguf_blocks
    from radixlang_runtime.model.layers.gguf_linear import GGUFLinear

    N, K = 13, 32 * 7
    blocks = torch.from_numpy(random_gguf_blocks(fmt, N, K, 0.05, np.random.default_rng(1)))
    if cpu_ops.load() is None:
        return
    w = torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType[fmt]))  # [N, K]
    lin = GGUFLinear(w.to(torch.bfloat16), None, blocks, fmt)
    assert lin.q8 and lin.dense is None and lin.weight is None
    x = torch.randn(quant_ops.KQ_GEMM_MAX_M + 5, K).to(torch.bfloat16)
    ref = x @ w.to(torch.bfloat16).T
    torch.testing.assert_close(lin(x), ref, rtol=0, atol=0)
    few = x[:quant_ops.QLINEAR_MAX_M + 5]  # above the tiles' kernel: the int8 GEMM on the file's layout
    torch.testing.assert_close(lin(few), quant_ops.gguf_kq_gemm(few, blocks, fmt), rtol=0, atol=0)


def test_bf16_batches_above_the_decode_kernel_run_the_int8_gemm(monkeypatch):
    """bf16, KQ_MAX_M < M <= KQ_GEMM_MAX_M: a part on its blocks runs gguf_kq_gemm into its columns, a part on
    gemv_q8.c's tiles gguf_q8_tiles_gemm (bias added after); above KQ_GEMM_MAX_M the dequantized tiles run
    where bf16 GEMMs are native, the int8 GEMM still where they are emulated; all close to the float product."""
    import types

    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from radixlang_kernels.testing import random_gguf_blocks
    from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear

    if cpu_ops.load() is None:
        pytest.skip("no C compiler: the blocks are dequantized per tile")
    rng = np.random.default_rng(2)
    parts = [(torch.from_numpy(random_gguf_blocks(f, n, 512, 0.05, rng)), f) for f, n in (("Q3_K", 40), ("Q4_K", 24))]
    w = torch.from_numpy(np.concatenate([dequantize(b.numpy(), GGMLQuantizationType[f]) for b, f in parts]))
    bias = torch.randn(64).to(torch.bfloat16)
    lin = GGUFBlockLinear(parts, 512, bias, torch.bfloat16)
    calls = []
    gemm = quant_ops.gguf_kq_gemm
    monkeypatch.setattr(quant_ops, "gguf_kq_gemm", lambda x, b, f, **kw: calls.append(f) or gemm(x, b, f, **kw))
    tiles = quant_ops.gguf_q8_tiles(parts[1][0], "Q4_K")
    tiled_calls, tiles_gemm = [], quant_ops.gguf_q8_tiles_gemm
    monkeypatch.setattr(quant_ops, "gguf_q8_tiles_gemm",
                        lambda *a, **kw: tiled_calls.append(a[0].shape[0]) or tiles_gemm(*a, **kw))
    for M in (quant_ops.KQ_TILES_GEMM_MIN_M - 1, quant_ops.KQ_TILES_GEMM_MIN_M):  # decode batches: the tiled part's
        x = torch.randn(M, 512).to(torch.bfloat16)  # GEMM from KQ_TILES_GEMM_MIN_M rows, the blocks' decode kernel
        tiled_calls.clear()
        y = lin(x)
        part = tiles_gemm(x, tiles, "Q4_K", 24) if tiled_calls else quant_ops.gguf_q8_gemv(x, tiles, "Q4_K", 24)
        assert tiled_calls == ([M] if M >= quant_ops.KQ_TILES_GEMM_MIN_M else []) and not calls, M
        assert torch.equal(y, torch.cat([quant_ops.gguf_kq_gemv(x, parts[0][0], "Q3_K"), part], dim=1) + bias)
    native = {True: [], False: ["Q3_K"]}
    for M, native_bf16, want in ((quant_ops.KQ_MAX_M + 1, True, ["Q3_K"]), (quant_ops.KQ_GEMM_MAX_M, True, ["Q3_K"]),
                                 *((quant_ops.KQ_GEMM_MAX_M + 1, n, w) for n, w in native.items())):
        monkeypatch.setattr(quant_ops, "detect", lambda n=native_bf16: types.SimpleNamespace(native_bf16=n))
        calls.clear()
        x = torch.randn(M, 512).to(torch.bfloat16)
        y = lin(x)
        assert calls == want, M
        if want:
            tiled = quant_ops.gguf_q8_tiles_gemm(x, tiles, "Q4_K", 24)
            assert torch.equal(y, torch.cat([gemm(x, parts[0][0], "Q3_K"), tiled], dim=1) + bias)
        ref = x.float() @ w.T + bias.float()
        assert float((y.float() - ref).norm()) < 0.02 * float(ref.norm()), M


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fused_decode_on_mixed_type_parts_is_bit_identical_to_the_modules(tiny, dtype):
    """decode_layer.c takes a file's linears whose parts differ in type (q / k / v, gate / up: tiles and blocks
    with int8 activations side by side in bf16, float32's exact sums): the same logits and K/V, bit for bit,
    as the modules, one row, a batch of rows and (bf16) a batch above 16 rows, where both run gemm_kquant.c on
    the tiles and blocks."""
    name = "every_type"
    import torch

    from radixlang_runtime import Engine
    from radixlang_runtime.model.layers.gguf_block_linear import GGUFBlockLinear
    from runner_steps import decode_scenario

    if cpu_ops.load() is None:
        pytest.skip("no C compiler: no fused decode")
    model_dir, _, _ = tiny[name]
    with Engine(model_dir, dtype=dtype, quantization="gguf", max_total_tokens=1024, model_impl="native") as eng:
        runner, model = eng.runner, eng.runner.model
        fused = model.fused_decode
        assert fused is not None, runner.cpu_paths
        assert any(isinstance(m, GGUFBlockLinear) and len(m.fmts) > 1 for m in model.modules())
        calls, run = [], fused.run
        fused.run = lambda residual, fb: (calls.append(fb.batch_size), run(residual, fb))[1]
        many = [[(7 * i + 3 * j) % 900 + 50 for j in range(4 + i % 3)] for i in range(20)]
        cases = [(PROMPTS[:1], 0, 0, 100), (PROMPTS, 2, 400, 500)]
        if dtype == "bfloat16":  # 16 rows: the tiles' GEMM beside the blocks' decode kernel; 20: GEMMs only
            assert fused.max_batch == quant_ops.KQ_GEMM_MAX_M
            assert quant_ops.KQ_TILES_GEMM_MIN_M <= 16 <= quant_ops.KQ_MAX_M
            cases += [(many[:16], 30, 200, 300), (many, 6, 600, 800)]
        with torch.inference_mode():
            for prompts, row0, slot0, slot1 in cases:
                got, got_kv = decode_scenario(runner, prompts, row0, slot0, steps=3)
                model.fused_decode = None
                want, want_kv = decode_scenario(runner, prompts, row0 + len(prompts), slot1, steps=3)
                model.fused_decode = fused
                assert all(torch.equal(a, b) for a, b in zip(got, want))
                assert torch.equal(got_kv, want_kv)
        assert calls == [B for prompts, *_ in cases for B in [len(prompts)] * 3]  # every step ran decode_layer.c


DTYPE_SCRIPT = """
import json, sys
from radixlang_runtime import Engine
out = {}
for dtype in ("auto", "float32"):
    with Engine(sys.argv[1], model_cache_dir=sys.argv[2], dtype=dtype, max_total_tokens=1024) as eng:
        out[dtype] = [str(eng.runner.dtype), eng.get_stats()["cpu"]["native_bf16"], eng.runner.cpu_paths.linear]
print(json.dumps(out))
"""


def test_auto_dtype_of_a_gguf_on_its_blocks_is_bf16_without_native_bf16(tiny):
    """With AVX512-BF16 hidden (RADIXLANG_CPU_MASK), `--dtype auto` still picks bf16 for a .gguf served on its
    blocks: its linears run int8 dot products, which need no bf16 hardware; float32 stays when asked for."""
    import json
    import subprocess
    import sys

    if cpu_ops.load() is None:
        pytest.skip("no C compiler: the blocks are dequantized per tile")
    model_dir, path, _ = tiny["q4_k_m"]
    env = dict(os.environ, RADIXLANG_CPU_MASK="avx512_bf16")
    res = subprocess.run([sys.executable, "-c", DTYPE_SCRIPT, path, os.path.dirname(model_dir)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["auto"][:2] == ["torch.bfloat16", False]
    assert "int8 activations" in got["auto"][2]
    assert got["float32"][0] == "torch.float32"
    assert "int8 activations" not in got["float32"][2]
