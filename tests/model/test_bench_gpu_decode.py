"""benchmarks/bench_gpu_decode.py's CPU side (the GPU run is benchmarks/gpu_check.sh's): the Llama-3-8B shape's
weights add up to the published parameter count, the checkpoint builder at a tiny shape makes a directory the
Engine serves, the whole script runs end to end on the CPU with the graph path emulated, bad arguments are refused."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_gpu_decode as bench  # noqa: E402


def test_llama3_8b_shape_has_its_parameter_count():
    cfg = bench.llama_config("llama3-8b", 4096)
    params = sum(_numel(s) for s in bench.tensor_shapes(cfg).values())
    assert params == 8_030_261_248  # Meta-Llama-3-8B's count
    assert bench.weight_bytes_read(cfg) == 2 * (params - 128256 * 4096)  # the embedding table is not read whole
    assert bench.kv_bytes_per_token(cfg) == 2 * 32 * 8 * 128 * 2


def test_tiny_checkpoint_runs_end_to_end_on_the_cpu(tmp_path):
    model_dir = str(tmp_path / "ckpt")
    bench.build_checkpoint(model_dir, "tiny", "cpu", context=512, shard_bytes=8 << 20)
    assert len([f for f in os.listdir(model_dir) if f.endswith(".safetensors")]) > 1  # shards and their index
    out = tmp_path / "out.json"
    rc = bench.main(["--shape", "tiny", "--device", "cpu", "--modes", "emulate", "--quick", "--batches", "1,3",
                     "--steps", "2", "--context", "512", "--model-dir", model_dir, "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())["results"]
    assert [r["mode"] for r in res] == ["emulate"]
    graphs = res[0]["cuda_graph"]
    assert graphs["mode"] == "emulate" and graphs["buckets"][-1] == 3 and graphs["replayed_steps"] > 0
    assert [d["batch"] for d in res[0]["decode"]] == [1, 3]
    assert all(d["ms_per_step"] > 0 and d["hbm_share"] is None for d in res[0]["decode"])  # no peak on the CPU
    assert res[0]["W1_tok_s"] > 0 and res[0]["W2_tok_s"] > 0


@pytest.mark.parametrize("argv,needle", [
    (["--device", "cpu", "--modes", "on"], "mode on captures CUDA graphs"),
    (["--modes", "on,fast"], "unknown mode"),
    (["--batches", "1,x"], "--batches must be comma-separated integers"),
    (["--batches", "0"], "must be >= 1"),
])
def test_bad_arguments_are_refused(argv, needle, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert needle in capsys.readouterr().err


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
