"""--model-impl transformers: any decoder transformers can load, run by transformers' own modeling code, with
its attention routed into the paged KV pool.

transformers looks an attention function up by `config._attn_implementation` in its AttentionInterface; this
module registers one ("radixlang") that stores the layer's K/V at the step's slots and attends through the
runtime's attention backend, so the radix cache, chunked prefill, retraction, constrained decoding and
logprobs work unchanged. A step runs as one "sequence" of T flattened tokens ([1, T]) whose position_ids are
the runner's positions; transformers' own mask and cache are off (the backend knows the requests).

The step reaches the attention function through an explicit, guarded context (STYLE.md §7): `_bind` sets it
for one forward on this thread and refuses nesting; the attention function refuses to run outside one.

Before loading, config.json's attention features the routing cannot represent are refused by name
(models/fallback_probe.refuse_unroutable: chunked attention, soft-capping, sinks, shared KV). At load a
two-token probe forward checks what the paged path cannot honour and refuses it by name: a layer whose
attention does not go through the registry, head counts or head_dim other than config.json's, a scaling other
than head_dim ** -0.5, soft-capping, attention sinks, non-causal attention and sliding windows the config did
not declare (a declared window shorter than the context is refused by ModelConfig). Then the parity probe
(models/fallback_probe.run_parity_probe) runs a short prompt through the paged routing and through
transformers' own attention and refuses the first layer whose output differs.

A checkpoint whose config.json has an `auto_map` (its own modeling code) loads that code only with
--trust-remote-code (parse_transformers(..., path, trust_remote_code=True)); it then passes the same gates.
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
from torch import nn

from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.mem.kv_pool import KVPool
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.models.fallback_probe import ProbeReport, refuse_unroutable, run_parity_probe
from radixlang_runtime.model.layers.rope_spec import RopeSpec

logger = logging.getLogger(__name__)

ATTN_NAME = "radixlang"  # the name registered in transformers' AttentionInterface / AttentionMaskInterface
_REFUSED_KWARGS = ("softcap", "s_aux", "sinks")  # attention kwargs that change the math (None: not in use)


# multi-head latent attention caches a latent, and its keys and values differ in width: the paged pool here holds
# K and V of one head_dim (transformers' modules fail on the shapes); the native families serve it
_MLA_REFUSAL = ("architecture {arch!r}: kv_lora_rank (multi-head latent attention) is not supported with "
                "--model-impl transformers; DeepseekV2ForCausalLM and DeepseekV3ForCausalLM run natively "
                "(--model-impl native / auto)")


def needs_remote_code(cfg: dict) -> bool:
    """config.json's auto_map names the checkpoint's own modeling code for its causal LM (or its config class,
    for a model_type transformers does not ship)."""
    from transformers import CONFIG_MAPPING

    auto_map = cfg.get("auto_map") or {}
    return bool(auto_map) and ("AutoModelForCausalLM" in auto_map or cfg.get("model_type") not in CONFIG_MAPPING)


def parse_transformers(cfg: dict, path: Optional[str] = None, trust_remote_code: bool = False) -> ModelConfig:
    """config.json -> the ModelConfig the runner sizes the KV pool with (heads, head_dim, layers, vocab);
    refuses an architecture transformers has no decoder class for, whose attention bypasses the registry, or
    whose attention the routing cannot represent (fallback_probe.refuse_unroutable). A checkpoint with its own
    modeling code (auto_map) needs trust_remote_code (--trust-remote-code) and its directory `path`."""
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    arch = (cfg.get("architectures") or ["?"])[0]
    model_type = cfg.get("model_type")
    if cfg.get("kv_lora_rank") is not None:
        raise ValueError(_MLA_REFUSAL.format(arch=arch))
    remote = needs_remote_code(cfg)
    if remote and not trust_remote_code:
        raise ValueError(f"architecture {arch!r}: config.json's auto_map loads the checkpoint's own modeling code "
                         f"({(cfg.get('auto_map') or {}).get('AutoModelForCausalLM', 'auto_map')}); it runs only with "
                         "--trust-remote-code (trust_remote_code=True)")
    if cfg.get("quantization_config") is not None:
        raise ValueError("quantization_config is not supported with --model-impl transformers")
    if remote:
        if path is None or "AutoModelForCausalLM" not in cfg["auto_map"]:
            raise ValueError(f"architecture {arch!r}: --trust-remote-code needs the checkpoint directory and an "
                             "auto_map entry AutoModelForCausalLM")
        from transformers import AutoConfig

        text = AutoConfig.from_pretrained(path, trust_remote_code=True).get_text_config()
    else:
        if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or model_type not in CONFIG_MAPPING:
            raise ValueError(f"architecture {arch!r} (model_type {model_type!r}) has no decoder (causal LM) class in "
                             f"transformers {transformers.__version__}: --model-impl transformers cannot serve it")
        model_cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type], None)
        if model_cls is None or not getattr(model_cls, "_supports_attention_backend", False):
            raise ValueError(f"architecture {arch!r}: its attention is not reachable through transformers' attention-"
                             "function registry, so it cannot run on the paged KV pool (--model-impl transformers)")
        text = _text_config(CONFIG_MAPPING[model_type], cfg, arch)
    refuse_unroutable(text, arch)
    if getattr(text, "kv_lora_rank", None) is not None:
        raise ValueError(_MLA_REFUSAL.format(arch=arch))
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    window = getattr(text, "sliding_window", None)
    eos = getattr(text, "eos_token_id", None)
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    mpe = getattr(text, "max_position_embeddings", None) or 2048
    return ModelConfig(
        architecture=arch, vocab_size=text.vocab_size, hidden_size=text.hidden_size,
        intermediate_size=getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
        num_hidden_layers=text.num_hidden_layers, num_attention_heads=heads,
        num_key_value_heads=getattr(text, "num_key_value_heads", None) or heads, head_dim=head_dim,
        rms_norm_eps=1e-6,  # unused: transformers' modules normalise
        rope=RopeSpec.plain(head_dim, 10000.0, mpe),  # unused: transformers' modules apply their own rotary
        max_position_embeddings=mpe, tie_word_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
        attention_bias=False, qk_norm=False, bos_token_id=getattr(text, "bos_token_id", None), eos_token_ids=eos_ids,
        torch_dtype=str(cfg.get("torch_dtype", cfg.get("dtype", "float32"))),
        sliding_window=None if window is None else int(window), model_impl="transformers",
        # the paged path runs every layer causal over the whole prefix: a declared window binds only up to itself
        max_context=None if window is None else int(window),
        max_context_reason=f"sliding_window {window} (--model-impl transformers attends over the whole prefix)",
        trust_remote_code=remote)


def _text_config(config_cls: Any, cfg: dict, arch: str) -> Any:
    """transformers' config (its text part) from config.json; its own validation errors name the architecture."""
    try:
        return config_cls.from_dict(cfg).get_text_config()
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ValueError(f"architecture {arch!r}: transformers cannot build its config for --model-impl "
                         f"transformers ({type(e).__name__}: {e})") from None


# ---------------------------------------------------------------- the step context (explicit, guarded)
@dataclass
class _Probe:
    """What the load-time probe forward saw, per attention call."""

    layers: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class _Step:
    fb: Optional[ForwardBatch]  # None in the probe (nothing is stored)
    backend: Any  # AttentionBackend
    cfg: ModelConfig
    probe: Optional[_Probe] = None


_local = threading.local()  # .step: the _Step of the forward running on this thread, or None


@contextmanager
def _bind(step: _Step) -> Iterator[None]:
    if getattr(_local, "step", None) is not None:
        raise RuntimeError("a radixlang transformers forward is already running on this thread (nesting refused)")
    _local.step = step
    try:
        yield
    finally:
        _local.step = None


def _current() -> _Step:
    step = getattr(_local, "step", None)
    if step is None:
        raise RuntimeError("the radixlang attention function ran outside a radixlang forward (no step bound)")
    return step


def _check_call(step: _Step, module: nn.Module, q: torch.Tensor, k: torch.Tensor, scaling: Optional[float],
                dropout: float, kwargs: dict) -> None:
    """The probe's checks of one attention call (problems collected, raised together after the forward)."""
    cfg, probe = step.cfg, step.probe
    layer = getattr(module, "layer_idx", None)
    probe.layers.append(layer)
    if layer is None:
        probe.problems.append(f"attention module {type(module).__name__} has no layer_idx")
    shapes = (q.shape[1], k.shape[1], q.shape[-1], k.shape[-1])
    if shapes != (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.head_dim):
        probe.problems.append(f"attention shapes (heads, kv heads, head_dim) {shapes[:3]} differ from config.json's "
                              f"{(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)}")
    scale = cfg.head_dim ** -0.5 if scaling is None else float(scaling)
    if not math.isclose(scale, step.backend.scale, rel_tol=1e-6):
        probe.problems.append(f"attention scaling {scale} (not head_dim ** -0.5) is not supported")
    if dropout:
        probe.problems.append(f"attention dropout {dropout} is not supported")
    for key in _REFUSED_KWARGS:
        if kwargs.get(key) is not None:
            probe.problems.append(f"attention {key} is not supported")
    if kwargs.get("is_causal") is False or getattr(module, "is_causal", True) is False:
        probe.problems.append("non-causal attention is not supported")
    window = kwargs.get("sliding_window")
    if window is not None and window != cfg.sliding_window:
        probe.problems.append(f"sliding_window {window} (config.json declares {cfg.sliding_window}) is not supported")


def paged_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Any, scaling: Optional[float] = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query [1, H, T, D], key / value [1, Hkv, T, D] (rotary applied)
    -> ([1, T, H, D], no weights). Stores K/V at the step's out_loc and attends over each request's pool rows."""
    step = _current()
    _, H, T, D = query.shape
    if step.probe is not None:
        _check_call(step, module, query, key, scaling, dropout, kwargs)
        return query.new_zeros(1, T, H, D), None
    dtype = step.fb.kv_pool.k_buffers[module.layer_idx].dtype
    q = query[0].transpose(0, 1).to(dtype).contiguous()  # [T, H, D]
    k = key[0].transpose(0, 1).to(dtype).contiguous()  # [T, Hkv, D]
    v = value[0].transpose(0, 1).to(dtype).contiguous()
    o = step.backend.forward(q, k, v, module.layer_idx, step.fb)  # [T, H D]
    return o.view(1, T, H, D).to(query.dtype), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask function registered beside paged_attention: the backend masks per request, so none is built."""
    return None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, paged_attention)
    AttentionMaskInterface.register(ATTN_NAME, _no_mask)


def _probe_batch(ids: torch.Tensor, cfg: ModelConfig, device: torch.device) -> ForwardBatch:
    """One fresh request of len(ids) tokens over a scratch float32 pool of as many slots (the parity probe)."""
    n = int(ids.shape[0])
    pool = KVPool(n, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, torch.float32, device, 1, n)
    slots = torch.arange(n, device=device)
    pool.req_to_token[0, :n] = slots
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    return ForwardBatch(phase="extend", batch_size=1, input_ids=ids, positions=slots, out_loc=slots, req_rows=zero,
                        seq_lens=zero + n, seq_lens_cpu=[n], prefix_lens_cpu=[0], extend_lens_cpu=[n], kv_pool=pool)


# ---------------------------------------------------------------- the model
class TransformersForCausalLM(nn.Module):
    """The registry's model contract (cfg, backend, rotary, shard, reduce; load_hf_state_dict; forward(fb,
    logit_rows) -> float32 logits [R, V]) over transformers' AutoModelForCausalLM."""

    def __init__(self, cfg: ModelConfig, backend: Any, rotary: Any, shard: Any = None, reduce: Any = None):
        super().__init__()
        if reduce is not None or (shard is not None and shard.size > 1):
            raise ValueError("tensor parallelism is not supported with --model-impl transformers (use tp_size 1)")
        self.cfg, self.backend = cfg, backend
        # [0]: moved by the runner (to_empty / .to(dtype)) like any parameter; the loaded model follows it
        self.register_buffer("placement", torch.zeros(1), persistent=False)
        self.hf: Optional[nn.Module] = None
        self.probe_report: Optional[ProbeReport] = None  # the load-time parity probe's figures
        self.fused_decode = None  # the runner's C decode layer is the native decoder's; never set here
        self._keep_rows = False  # whether hf.forward takes logits_to_keep (rows picked before the head)

    def load_hf_state_dict(self, tensors: Any) -> None:
        """Loads the checkpoint directory with transformers (its names, tied weights and buffers), then probes."""
        from transformers import AutoModelForCausalLM

        register()
        dtype, device = self.placement.dtype, self.placement.device
        hf = AutoModelForCausalLM.from_pretrained(tensors.path, dtype=dtype, attn_implementation=ATTN_NAME,
                                                  trust_remote_code=self.cfg.trust_remote_code)
        self.hf = hf.to(device).eval()
        self.hf.config.use_cache = False
        self._keep_rows = "logits_to_keep" in inspect.signature(self.hf.forward).parameters
        self._probe()
        self.probe_report = self._parity_probe()
        logger.info("%s through transformers: parity probe passed (%s)", self.cfg.architecture,
                    self.probe_report.describe())

    def _probe(self) -> None:
        probe = _Probe()
        ids = torch.tensor([[0, min(1, self.cfg.vocab_size - 1)]], device=self.placement.device)
        with torch.inference_mode(), _bind(_Step(None, self.backend, self.cfg, probe)):
            self.hf(input_ids=ids, position_ids=torch.arange(2, device=ids.device)[None], use_cache=False)
        want = list(range(self.cfg.num_hidden_layers))
        if probe.layers != want:
            probe.problems.insert(0, f"attention calls reached the registry for layers {probe.layers}, expected "
                                     f"{want} (a layer's attention is not reachable through the registry)")
        if probe.problems:
            raise ValueError(f"{self.cfg.architecture} cannot run with --model-impl transformers: "
                             + "; ".join(dict.fromkeys(probe.problems)))

    def _parity_probe(self) -> ProbeReport:
        """The first layers on one short prompt through the paged routing (this backend over a scratch float32
        pool) and through transformers' eager attention (fallback_probe.run_parity_probe)."""
        cfg, device = self.cfg, self.placement.device

        def routed(ids: torch.Tensor, pos: torch.Tensor) -> Any:
            fb = _probe_batch(ids[0], cfg, device)
            self.backend.init_forward_metadata(fb)
            with _bind(_Step(fb, self.backend, cfg)):
                return self.hf(input_ids=ids, position_ids=pos, use_cache=False)

        def reference(ids: torch.Tensor, pos: torch.Tensor) -> Any:
            try:
                self.hf.set_attn_implementation("eager")
            except (ValueError, ImportError) as e:
                raise ValueError(f"{cfg.architecture} cannot run with --model-impl transformers: the parity probe "
                                 f"needs transformers' eager attention for it ({e})") from None
            try:
                return self.hf(input_ids=ids, position_ids=pos, use_cache=False)
            finally:
                self.hf.set_attn_implementation(ATTN_NAME)

        return run_parity_probe(self.hf, cfg.architecture, cfg.num_hidden_layers, cfg.vocab_size, routed, reference)

    def forward(self, fb: ForwardBatch, logit_rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """float32 logits [R, V] for the flattened token rows `logit_rows` (all T rows when None)."""
        kwargs = {"logits_to_keep": logit_rows} if self._keep_rows and logit_rows is not None else {}
        with _bind(_Step(fb, self.backend, self.cfg)):
            out = self.hf(input_ids=fb.input_ids[None], position_ids=fb.positions[None], use_cache=False, **kwargs)
        logits = out.logits[0]  # [R or T, V]
        if logit_rows is not None and not kwargs:
            logits = logits[logit_rows]
        return logits.float()

    # --- what the native decoder offers and this path does not: refused by name, or nothing to do
    def quantize_int8(self) -> int:
        raise ValueError("--quantization int8 is not supported with --model-impl transformers")

    def use_gguf_blocks(self, blocks: dict) -> int:
        raise ValueError("--quantization gguf is not supported with --model-impl transformers")

    def pack_for_cpu(self, tiles: bool = False) -> int:
        return 0  # transformers' nn.Linear modules run as they are

    def enable_cpu_ops(self) -> None:
        pass  # norms and activations are transformers' modules; attention goes through the backend's kernels
