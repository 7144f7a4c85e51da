"""--trust-remote-code: a checkpoint whose config.json has an auto_map loads its own modeling code (written here:
a renamed Llama subclass) through transformers into the fallback, passes the parity probe and serves greedy
token for token as transformers does in float32; without the flag it is refused naming the flag; remote code
whose attention the routing does not see (a mask of its own) is refused by the probe."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tiny_checkpoints import hf_greedy

CONFIG_PY = '''
from transformers import LlamaConfig


class TinyCustomConfig(LlamaConfig):
    model_type = "tiny_custom"
'''
MODELING_PY = '''
import torch
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaAttention

from .configuration_tiny import TinyCustomConfig


class TinyCustomForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig


class BandAttention(LlamaAttention):
    """Llama attention under a mask of its own: each query sees its last 4 positions only."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        n = hidden_states.shape[1]
        i = torch.arange(n, device=hidden_states.device)
        keep = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 4)
        band = torch.zeros(n, n, dtype=hidden_states.dtype, device=hidden_states.device)
        band = band.masked_fill(~keep, float("-inf"))[None, None]
        return super().forward(hidden_states, position_embeddings, band, **kwargs)


class TinyBandForCausalLM(LlamaForCausalLM):
    config_class = TinyCustomConfig

    def __init__(self, config):
        super().__init__(config)
        for i, layer in enumerate(self.model.layers):
            layer.self_attn = BandAttention(config, i)
        self.post_init()
'''
TINY = dict(vocab_size=None, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, initializer_range=0.3, max_position_embeddings=256)
PROMPTS = [[(i * 131 + 7 * j) % 40000 + 100 for i in range(n)] for j, n in enumerate((20, 9, 33))]
NEW = 12


def write_checkpoint(path, model_class: str):
    """The two code files, random float32 weights of `model_class` and config.json's auto_map, in path."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radixlang_runtime.model.loader.resolve import embedded_tokenizer_dir

    (path / "configuration_tiny.py").write_text(CONFIG_PY)
    (path / "modeling_tiny.py").write_text(MODELING_PY)
    (path / "__init__.py").write_text("")
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    name = f"tiny_remote_{model_class.lower()}"
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py", submodule_search_locations=[str(path)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    try:
        spec.loader.exec_module(package)
        conf = importlib.import_module(f"{name}.configuration_tiny")
        modeling = importlib.import_module(f"{name}.modeling_tiny")
        torch.manual_seed(0)
        cfg = conf.TinyCustomConfig(**{**TINY, "vocab_size": len(tok)})
        getattr(modeling, model_class)(cfg).to(torch.float32).save_pretrained(path, safe_serialization=True)
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
    tok.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=[model_class], model_type="tiny_custom",
                  auto_map={"AutoConfig": "configuration_tiny.TinyCustomConfig",
                            "AutoModelForCausalLM": f"modeling_tiny.{model_class}"})
    (path / "config.json").write_text(json.dumps(config))
    (path / "__init__.py").unlink()
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def test_remote_code_serves_greedy_like_transformers(tmp_path):
    from radixlang_runtime import Engine

    model = write_checkpoint(tmp_path, "TinyCustomForCausalLM")
    assert type(model).__name__ == "TinyCustomForCausalLM"
    want = [hf_greedy(model, p, NEW) for p in PROMPTS]
    sp = {"max_new_tokens": NEW, "min_new_tokens": NEW, "temperature": 0}
    with Engine(str(tmp_path), dtype="float32", max_total_tokens=512, chunked_prefill_size=16,
                trust_remote_code=True, debug_check_integrity=True) as eng:
        outs = eng.generate(input_ids=PROMPTS, sampling_params=sp)
        again = eng.generate(input_ids=PROMPTS[2], sampling_params=sp)
    assert [o["output_ids"] for o in outs] == want
    assert again["output_ids"] == want[2] and again["meta_info"]["cached_tokens"] > 0


def test_without_the_flag_the_checkpoint_is_refused_naming_it(tmp_path):
    from radixlang_runtime import Engine

    write_checkpoint(tmp_path, "TinyCustomForCausalLM")
    with pytest.raises(ValueError, match=r"architecture 'TinyCustomForCausalLM': config.json's auto_map loads the "
                                         r"checkpoint's own modeling code \(modeling_tiny.TinyCustomForCausalLM\); "
                                         r"it runs only with --trust-remote-code"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=512)


def test_remote_attention_the_routing_does_not_see_is_refused(tmp_path):
    from radixlang_runtime import Engine

    write_checkpoint(tmp_path, "TinyBandForCausalLM")
    with pytest.raises(ValueError, match=r"TinyBandForCausalLM cannot run with --model-impl transformers: the parity "
                                         r"probe .* found layer 0's output .* max abs difference"):
        Engine(str(tmp_path), dtype="float32", max_total_tokens=512, trust_remote_code=True)


def test_the_flag_parses():
    from radixlang_runtime.server_cli import parse_server_args

    assert parse_server_args(["--trust-remote-code"]).trust_remote_code is True
    assert parse_server_args([]).trust_remote_code is False
