"""The peer systems of ../shared/peers (vLLM-CPU, llama.cpp) run by our benchmarks side by side.

Each peer script runs in its own venv under $PEERS_DIR (default /tmp/peers; install with
../shared/peers/install_vllm.sh and build_llamacpp.sh, then make_gguf.py [Q8_0] for llama.cpp's BF16 /
Q8_0 files); a peer that is not installed is reported, not run. The token ids are workloads.py's, so
every system (ours included, when peers are asked for) runs the same prompts; fingerprints are printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile


def default_peers_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers")


def peer_workloads(peers_dir: str) -> dict[str, dict]:
    """W1 / W2 / W3 on the peers' exact token ids (workloads.py)."""
    sys.path.insert(0, peers_dir)
    import workloads as W  # noqa: E402

    print(f"peer workloads: W1 {W.fingerprint(W.w1_prompts())}  W2 {W.fingerprint([W.w2_prompt()])}  "
          f"W3 {W.fingerprint(W.w3_prompts())}")
    return {"W1": {"ids": W.w1_prompts(), "new": W.W1_OUT}, "W2": {"ids": [W.w2_prompt()], "new": W.W2_OUT},
            "W3": {"ids": W.w3_prompts(), "new": W.W3_OUT}}


# peer -> [(row name, workload, script, extra args, RESULT field)]. W1: output tok/s; W2: decode tok/s
# (tokens 2..256 over their time); W3: wall seconds with the peer's prefix reuse on / off.
def peer_runs(vllm_dtype: str = "bfloat16") -> dict[str, list]:
    """The rows each peer runs; vllm_dtype float32 is vLLM-CPU on a CPU without AVX512-BF16 (the
    second table: ours under RADIXLANG_CPU_MASK=avx512_bf16 runs float32 there too)."""
    v = "vllm-" + {"bfloat16": "bf16", "float32": "fp32"}[vllm_dtype]
    return {
        "vllm": [(v, "W1", "bench_vllm.py", ["--dtype", vllm_dtype], "out_tok_s"),
                 (v, "W2", "bench_vllm.py", ["--dtype", vllm_dtype], "decode_tok_s_per_seq"),
                 (v, "W3", "bench_vllm.py", ["--dtype", vllm_dtype, "--prefix-caching", "on"], "wall_s"),
                 (f"{v} no-prefix-caching", "W3", "bench_vllm.py", ["--dtype", vllm_dtype, "--prefix-caching", "off"],
                  "wall_s")],
        "llamacpp": [("llamacpp-BF16", "W1", "bench_llamacpp.py",
                      ["--mode", "batch", "--gguf", "BF16", "--flash", "on"], "out_tok_s")]
                    + [(f"llamacpp-{q}", "W2", "bench_llamacpp.py", ["--mode", "seq", "--gguf", q],
                        "decode_tok_s_per_seq")
                       for q in ("BF16", "Q8_0", "Q4_1")]
                    + [(f"llamacpp-BF16{'' if on == 'on' else ' no-prefix-share'}", "W3", "bench_llamacpp.py",
                        ["--mode", "batch", "--gguf", "BF16", "--flash", "on", "--prefix", on], "wall_s")
                       for on in ("on", "off")],
    }


PEER_RUNS = peer_runs()
PEER_VENVS = {"vllm": "venv-vllm", "llamacpp": "venv-llamacpp"}


def run_peers(peers: list[str], peers_dir: str, runs: int, model_dir: str, workloads: tuple[str, ...],
              vllm_dtype: str = "bfloat16") -> dict[str, dict]:
    """Each peer script (for the asked workloads) in its own venv and process: row -> {workload: values
    of its clean reps (all reps when none was clean)}, or "error"."""
    scratch = os.environ.get("PEERS_DIR", "/tmp/peers")
    env = {**os.environ, "PEERS_MODEL_HF": model_dir, "PEERS_DIR": scratch}
    rows: dict[str, dict] = {}
    for peer in peers:
        py = os.path.join(scratch, PEER_VENVS[peer], "bin", "python")
        for row, wl, script, extra, field in peer_runs(vllm_dtype)[peer]:
            if wl not in workloads:
                continue
            entry = rows.setdefault(row, {"dtype": row.split("-", 1)[1].split()[0], "peak_rss_mb": float("nan")})
            if not os.path.exists(py):
                entry["error"] = f"not installed ({PEER_VENVS[peer]} missing under {scratch})"
                continue
            with tempfile.NamedTemporaryFile(suffix=".jsonl") as out:
                cmd = [py, os.path.join(peers_dir, script), "--workload", wl, "--reps", str(runs),
                       "--out", out.name, *extra]
                res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
                recs = [json.loads(line[7:]) for line in res.stdout.splitlines() if line.startswith("RESULT ")]
            vals = [r[field] for r in recs if r.get(field) is not None and r.get("clean", True)] or \
                   [r[field] for r in recs if r.get(field) is not None]
            if not vals:
                entry["error"] = f"{script} {wl} failed: {(res.stderr or res.stdout)[-300:]}"
                continue
            entry[wl] = vals
    return rows


def physical_ceilings(peers_dir: str, model_dir: str) -> str:
    """bench_phys.py in this venv: GEMM GFLOP/s, memory read GB/s, the W1 / W2 limits they imply."""
    env = {**os.environ, "PEERS_MODEL_HF": model_dir}
    res = subprocess.run([sys.executable, os.path.join(peers_dir, "bench_phys.py")], env=env, capture_output=True,
                         text=True, timeout=900)
    return res.stdout.strip() or res.stderr[-500:]
