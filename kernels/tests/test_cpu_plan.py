"""cpu_ops.plan: which implementation runs each operation. Runs with and without a compiler (scripts/test.sh
runs it again under RADIXLANG_CPU_MASK=avx2,cc, where every operation must fall back to torch ops)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from radixlang_kernels import cpu_ops
from radixlang_kernels.cpu_caps import MASK_ENV, detect


def test_plan_never_chooses_a_kernel_outside_its_limits():
    cpu = torch.device("cpu")
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        for D, H, hkv in [(64, 9, 3), (13, 6, 3), (512, 4, 4), (64, 66, 2)]:
            p = cpu_ops.plan(cpu, dtype, D, H, hkv, packed_linears=False)
            kernel_ok = cpu_ops.load() is not None and dtype != torch.float16 and D <= 256 and H // hkv <= 32
            assert p.c_decode == kernel_ok and p.c_extend == kernel_ok
            assert ("+dpbf16" in p.extend_attention) == (kernel_ok and detect().isa == "avx512_bf16"
                                                         and dtype == torch.bfloat16 and D % 32 == 0)
            assert p.c_norm_act == kernel_ok  # bf16 and float32 entry points


def test_no_compiler_means_no_library_and_torch_everywhere():
    """The mask word `cc` hides the compiler: no library is built or loaded, and plan() picks torch ops for
    every operation (a fresh process: the mask is read once per process)."""
    code = ("import json, torch; from radixlang_kernels import cpu_ops; "
            "p = cpu_ops.plan(torch.device('cpu'), torch.bfloat16, 64, 9, 3, packed_linears=False); "
            "print(json.dumps({'lib': cpu_ops.load() is None, 'paths': p.to_dict(), "
            "'any_m': cpu_ops.dense_any_m(torch.float32)}))")
    env = dict(os.environ, **{MASK_ENV: "avx2,cc"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["lib"] is True and got["any_m"] is False
    assert got["paths"] == {"decode_attention": "torch:sdpa-gather", "extend_attention": "torch:sdpa",
                            "norm": "torch", "activation": "torch", "linear": "torch:F.linear",
                            "linear_attention": "none", "decode_layer": "modules"}


def test_plan_with_layer_shapes_names_the_layers_past_the_limits():
    """Per-layer shapes (Gemma 4: sliding layers of 256 lanes, global ones of 512): the C attention kernels take the
    layers they fit and the paths name the torch path of the others; no layer fitting: torch everywhere."""
    cpu = torch.device("cpu")
    p = cpu_ops.plan(cpu, torch.float32, 512, 8, 4, packed_linears=False, layer_shapes=[(4, 256), (2, 512)])
    if cpu_ops.load() is None:
        assert not p.c_decode and not p.c_extend
        return
    assert p.decode_attention == f"c:{detect().isa}, torch:sdpa-gather (head_dim 512)"
    assert p.extend_attention == f"c:{detect().isa}:portable, torch:sdpa (head_dim 512)"
    assert p.c_decode and p.c_extend and p.c_norm_act
    wide = cpu_ops.plan(cpu, torch.float32, 512, 8, 4, packed_linears=False, layer_shapes=[(4, 320), (2, 512)])
    assert wide.decode_attention == "torch:sdpa-gather" and not wide.c_norm_act
    assert [cpu_ops.c_attention_fits(*s) for s in [(256, 8, 4), (257, 8, 4), (64, 66, 2), (64, 6, 4)]] == \
        [True, False, False, False]
