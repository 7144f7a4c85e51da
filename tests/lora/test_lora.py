"""Multi-LoRA serving on a tiny random Llama: the base and two peft adapters (ranks 8 and 16 on every projection)
mixed in one batch, token for token against transformers + peft (each adapter merged with merge_and_unload,
float32); the radix cache keyed per adapter; adapter configs refused by name."""

from __future__ import annotations

import json
import os
import threading

import pytest
from lora_adapters import ADAPTERS, ALL, NEW, OTHER, PROMPT, SP, build_base_and_adapters, record_steps


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return root, build_base_and_adapters(root)


@pytest.fixture(scope="module")
def engine(setup):
    from radixlang_runtime import Engine

    root, _ = setup
    with Engine(str(root / "base"), dtype="float32", max_total_tokens=2048,
                lora_paths=[f"{n}={root / n}" for n in ADAPTERS], max_loras_per_batch=4) as eng:
        yield eng


def test_mixed_batch_matches_peft_merged(setup, engine):
    _, want = setup
    # the three differ: the comparison can fail
    assert len({tuple(want[n][tuple(PROMPT)]) for n in ("", "alpha", "beta")}) == 3
    seen = record_steps(engine)
    try:
        names = [None, "alpha", "beta", "alpha", None, "beta"]
        prompts = [PROMPT, PROMPT, PROMPT, OTHER, OTHER, OTHER]
        outs = engine.generate(input_ids=prompts, sampling_params=SP, lora_path=names)
    finally:
        del engine.runner._run
    assert [o["output_ids"] for o in outs] == [want[n or ""][tuple(p)] for n, p in zip(names, prompts)]
    assert any(set(ids) == {0, 1, 2} for ids in seen), seen  # base and both adapters in one forward pass
    engine.check_integrity()


def test_cache_is_per_adapter(engine):
    long = list(range(700, 740))  # several pages
    assert engine.flush_cache()
    first = engine.generate(input_ids=long, sampling_params=SP, lora_path="alpha")
    again = engine.generate(input_ids=long, sampling_params=SP, lora_path="alpha")
    other = engine.generate(input_ids=long, sampling_params=SP, lora_path="beta")
    base = engine.generate(input_ids=long, sampling_params=SP)
    base_again = engine.generate(input_ids=long, sampling_params=SP)
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] > 0 and again["output_ids"] == first["output_ids"]
    assert other["meta_info"]["cached_tokens"] == 0
    assert base["meta_info"]["cached_tokens"] == 0
    assert base_again["meta_info"]["cached_tokens"] > 0
    assert len({tuple(o["output_ids"]) for o in (first, other, base)}) == 3
    engine.check_integrity()


def test_base_batch_runs_the_base_path(setup, engine):
    _, want = setup
    seen = record_steps(engine)
    try:
        out = engine.generate(input_ids=PROMPT, sampling_params=SP)
    finally:
        del engine.runner._run
    assert out["output_ids"] == want[""][tuple(PROMPT)]
    assert seen and all(ids == [] for ids in seen)


def test_concurrent_calls_share_batches(setup, engine):
    _, want = setup
    results = {}

    def go(name):
        results[name] = engine.generate(input_ids=PROMPT, sampling_params=SP, lora_path=name)["output_ids"]

    threads = [threading.Thread(target=go, args=(n,)) for n in ("alpha", "beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == {n: want[n][tuple(PROMPT)] for n in ("alpha", "beta")}


def test_unknown_adapter_is_refused_by_name(engine):
    from radixlang_runtime.lora_spec import LoraNotFound

    with pytest.raises(LoraNotFound, match="'gamma'"):
        engine.generate(input_ids=PROMPT, sampling_params=SP, lora_path="gamma")


@pytest.mark.parametrize("change, named", [
    ({"use_dora": True}, "use_dora"), ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "all"}, "bias"), ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"target_modules": ["q_proj", "lm_head"]}, "lm_head"), ({"target_modules": ["embed_tokens"]}, "embed_tokens"),
    ({"target_modules": ".*proj"}, "pattern"), ({"r": 64}, "max-lora-rank"),
])
def test_adapter_config_refused_by_name(change, named):
    from radixlang_runtime.model.loader.lora_adapter import parse_config

    raw = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "none", **change}
    with pytest.raises(ValueError, match=named):
        parse_config(raw, "'x'", 32)


def test_rslora_scaling():
    from radixlang_runtime.model.loader.lora_adapter import parse_config

    assert parse_config({"r": 16, "lora_alpha": 8, "target_modules": ALL}, "x", 64).scaling == 0.5
    assert parse_config({"r": 16, "lora_alpha": 8, "target_modules": ALL, "use_rslora": True}, "x", 64).scaling == 2.0


def test_server_args_refuse_unsupported_combinations(tmp_path):
    from radixlang_runtime.server_args import ServerArgs

    assert ServerArgs(lora_paths=["a=/x"]).enable_lora  # --lora-paths implies --enable-lora
    assert ServerArgs(lora_paths=["a=/x"], disaggregation_mode="prefill").enable_lora  # PD: test_pd_lora.py
    with pytest.raises(ValueError, match="dp_size > 1"):
        ServerArgs(lora_paths=["a=/x"], dp_size=2)
    with pytest.raises(ValueError, match="given twice"):
        ServerArgs(lora_paths=["a=/x", "a=/y"])
    with pytest.raises(ValueError, match="lora_backend"):
        ServerArgs(lora_paths=["a=/x"], lora_backend="flashinfer")
    os.makedirs(tmp_path / "d")
    (tmp_path / "d" / "adapter_config.json").write_text(json.dumps({"r": 4, "target_modules": ["q_proj"]}))
    with pytest.raises(ValueError, match="adapter_model.safetensors"):
        from radixlang_runtime.model.loader.lora_adapter import load_adapter
        import torch
        load_adapter("d", str(tmp_path / "d"), 1, 2, 64, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("mode", ["csgmv", "past_the_row_bound", "torch_native"])
def test_lora_linear_interleaved_rows_match_the_merged_weights(mode, monkeypatch):
    """Rows of adapters 1, base, 2, 1 interleaved (a gather for adapter 1, a slice for 2), a delta on the k slice of
    a fused q/k/v output only: each row equals its own merged linear, through the C segment kernel and through
    torch (past the kernel's row bound, or --lora-backend torch_native)."""
    import torch
    from torch import nn

    from radixlang_runtime.model.layers import lora_sgmv
    from radixlang_runtime.model.layers.lora_linear import LoraLinear, LoraState

    sgmv = mode == "csgmv"
    if sgmv and not lora_sgmv.lora_sgmv_ready():
        pytest.skip("no C compiler: the torch path only")
    if mode == "past_the_row_bound":
        monkeypatch.setattr(lora_sgmv, "SGMV_MAX_ROWS", {dt: 0 for dt in lora_sgmv.SGMV_MAX_ROWS})

    torch.manual_seed(0)
    base, state = nn.Linear(8, 12, bias=False), LoraState(use_kernel=mode != "torch_native")
    lin = LoraLinear(base, {"q_proj": (0, 4), "k_proj": (4, 4), "v_proj": (8, 4)}, state)
    a = {i: torch.randn(2, 8) for i in (1, 2)}
    b = {i: torch.randn(4, 2) for i in (1, 2)}
    for i in (1, 2):
        lin.add(i, "k_proj", a[i], b[i])
    ids, counts = [1, 0, 2, 1], [2, 3, 1, 2]
    x = torch.randn(sum(counts), 8)
    state.set_rows(ids, counts, x.device)
    assert (state.segments is not None) == sgmv
    with torch.no_grad():
        y = lin(x)
        rows = [i for i, n in zip(ids, counts) for _ in range(n)]
        for r, lid in enumerate(rows):
            w = base.weight.clone()
            if lid:
                w[4:8] += b[lid] @ a[lid]
            torch.testing.assert_close(y[r], x[r] @ w.t())
        state.clear()
        assert torch.equal(lin(x), base(x))  # no groups: the base linear alone


def test_adapter_names_resolve():
    from radixlang_runtime.lora_spec import LoraNotFound, lora_id_of, lora_id_of_model, parse_lora_paths

    specs = parse_lora_paths(["alpha=/a", "/b/beta/"])
    assert [(s.name, s.path, s.lora_id) for s in specs] == [("alpha", "/a", 1), ("beta", "/b/beta/", 2)]
    names = tuple(s.name for s in specs)
    assert [lora_id_of(n, names) for n in (None, "alpha", "beta")] == [0, 1, 2]
    assert lora_id_of_model("base:beta", "base", names) == 2
    assert lora_id_of_model("alpha", "base", names) == 1
    assert lora_id_of_model("base", "base", names) is None
    assert lora_id_of_model("other:alpha", "base", names) is None  # not this server's model: the route's 404
    with pytest.raises(LoraNotFound, match="'gamma'"):
        lora_id_of_model("base:gamma", "base", names)


def test_load_and_unload_at_run_time(setup, engine):
    """A name loaded at run time serves its adapter; unloading refuses the name; a reload under the same name
    gets a new id, and none of the old adapter's cached prefixes."""
    from radixlang_runtime.lora_spec import LoraNotFound

    root, want = setup
    long = list(range(1500, 1540))
    gid = engine.load_lora_adapter("gamma", str(root / "alpha"))
    assert gid == 3
    got = engine.generate(input_ids=PROMPT, sampling_params=SP, lora_path="gamma")
    assert got["output_ids"] == want["alpha"][tuple(PROMPT)]
    first = engine.generate(input_ids=long, sampling_params=SP, lora_path="gamma")
    assert engine.generate(input_ids=long, sampling_params=SP, lora_path="gamma")["meta_info"]["cached_tokens"] > 0
    engine.unload_lora_adapter("gamma")
    with pytest.raises(LoraNotFound, match="'gamma'"):
        engine.generate(input_ids=PROMPT, sampling_params=SP, lora_path="gamma")
    assert engine.load_lora_adapter("gamma", str(root / "alpha")) == 4
    again = engine.generate(input_ids=long, sampling_params=SP, lora_path="gamma")
    assert again["meta_info"]["cached_tokens"] == 0 and again["output_ids"] == first["output_ids"]
    with pytest.raises(ValueError, match="already loaded"):
        engine.load_lora_adapter("gamma", str(root / "beta"))
    engine.check_integrity()


def test_unload_waits_for_running_requests(setup, engine):
    root, want = setup
    engine.load_lora_adapter("delta", str(root / "beta"))
    out = {}
    sp = {**SP, "max_new_tokens": 48, "min_new_tokens": 48}
    t = threading.Thread(target=lambda: out.update(engine.generate(input_ids=PROMPT, sampling_params=sp,
                                                                   lora_path="delta")))
    t.start()
    while not engine.get_stats()["num_running_reqs"] and t.is_alive():
        pass
    engine.unload_lora_adapter("delta")  # returns once the request has ended
    t.join(timeout=60)
    assert out["output_ids"][:NEW] == want["beta"][tuple(PROMPT)]
    assert out["meta_info"]["completion_tokens"] == 48
    engine.check_integrity()
