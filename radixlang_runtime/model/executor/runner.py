"""ModelRunner: owns the model, the KV pool and the sampler; runs one ModelBatch per call, returns its StepResult
(model/executor/step_io.py: the whole contract with the scheduler, which model/ never imports).

A step is planned on the scheduler's rank into StepInputs (plain lists: the ids, positions' slots,
table rewrites and logit rows), which is all any rank needs to run the model: with tensor
parallelism (parallel.py) rank 0 broadcasts it and the other ranks run `run_step` on it
(tp_worker.py); only rank 0 gets the full logits and samples.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass
from typing import Optional

import torch

from radixlang_runtime.utils import faults
from radixlang_runtime.mem import kv_memory
from radixlang_runtime.mem.kv_pool import KVPool
from radixlang_runtime.mem.state_pool import StatePool, StateShape
from radixlang_runtime.mem.verify_states import VerifyKeep, VerifyStates
from radixlang_kernels import cpu_ops
from radixlang_runtime.model.executor.device import gguf_blocks_dtype, resolve_device, resolve_dtype
from radixlang_runtime.model.executor import deterministic, memory
from radixlang_runtime.model.layers.attention import create_attention_backend
from radixlang_kernels.cpu_caps import detect
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.executor.forward_batch import ForwardBatch
from radixlang_runtime.model.executor.fused_decode import FusedDecode
from radixlang_runtime.model.executor.graph_runner import graph_off_reason, start_graphs
from radixlang_runtime.model.loader.gguf_mode import gguf_file_blocks, resolve_quantization
from radixlang_runtime.model.executor.hybrid_args import check_hybrid_args, state_slots
from radixlang_runtime.model.executor.linear_paths import quantized_linear_paths
from radixlang_runtime.model.models.llama import LlamaForCausalLM
from radixlang_runtime.model.models import family_for
from radixlang_runtime.model.models.vision_language import VisionTextTensors
from radixlang_runtime.model.layers.rotary import Rotary
from radixlang_runtime.model.layers.gated_deltanet import GatedDeltaNet
from radixlang_runtime.model.layers.mamba2 import Mamba2Mixer
from radixlang_runtime.model.executor.logprobs import fill_input_logprobs, plan_input_logprobs
from radixlang_runtime.model.layers.lora_linear import LoraModel
from radixlang_runtime.model.layers.lora_triton import triton_lora_ready
from radixlang_runtime.model.loader.lora_registry import LoraRegistry
from radixlang_runtime.model.loader.meta_build import build_on_meta
from radixlang_runtime.model.executor.sample_step import sample_step
from radixlang_runtime.model.layers.packed_linear import dense_tiles_available, packing_available
from radixlang_runtime.model.executor.pooling_step import fill_pooled, plan_pooling
from radixlang_runtime.model.executor.image_step import image_features, plan_images
from radixlang_runtime.model.executor.mrope import plan_mrope
from radixlang_runtime.model.executor.hidden_step import fill_hidden, hidden_rows, plan_hidden
from radixlang_runtime.model.executor.parallel import TPGroup, head_split, make_shard
from radixlang_runtime.model.prequant.linear import swap_linears
from radixlang_runtime.model.prequant.load import prequant_paths, prequant_tensors
from radixlang_runtime.model.loader.weights import SafetensorsDir
from radixlang_runtime.pooling import read_pooling_config
from radixlang_runtime.model.executor.sampler import Sampler
from radixlang_runtime.model.executor.step_io import ModelBatch, StepResult
from radixlang_runtime.model.executor.step_inputs import StepInputs, step_inputs
from radixlang_runtime.model.executor.verify_step import state_verify_rows, verify_as_decode
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class RunnerSizes:
    """What the scheduler needs to know about the runner's memory."""

    num_slots: int
    table_rows: int
    context_len: int


class ModelRunner:
    def __init__(self, args: ServerArgs, model_dir: str, tp: Optional[TPGroup] = None,
                 extra_kv: Optional[dict] = None):
        """extra_kv: the entry (KVPool.bytes_per_token's arguments) of a second pool with this one's slots
        (STANDALONE's draft, speculative/draft_model.py): a pool sized from memory leaves it its share."""
        self.extra_kv = extra_kv
        self.device = tp.device if tp is not None else resolve_device(args.device)
        self.args = args.resolve_for_device(self.device.type)
        self.dtype = resolve_dtype(self.args.dtype, self.device)
        self.model_dir = model_dir
        self.tp = tp
        if self.device.type == "cpu":
            memory.tune_malloc()  # step buffers keep their pages between steps (model/executor/memory.py)
        tensors = self._read_config()
        model = self._load_model(tensors)
        self._plan_paths(model, tensors)
        self.loras: Optional[LoraRegistry] = None  # every adapter served, which are resident (--max-loaded-loras)
        self.lora = self._load_loras(model) if self.args.enable_lora else None  # model/lora_linear.LoraModel
        logger.info("CPU %s; paths: %s", detect().summary(), self.cpu_paths.to_dict())
        self.model = model.eval()
        self.weights_bytes = memory.weights_bytes(model)  # fixed from here on: counted once
        self.graphs = None  # the warm-up in _build_pools runs eagerly
        self._build_pools()
        self.graphs, self.graph_info = start_graphs(self)  # decode under CUDA graphs (graph_runner.py)
        cfg = self.cfg
        logger.info("model %s (%s implementation): %s on %s, rope %s, KV pool %d tokens, %d request rows",
                    cfg.architecture, cfg.model_impl, self.dtype, self.device,
                    cfg.rope.describe() if cfg.model_impl == "native" else "transformers'", self.sizes.num_slots,
                    self.sizes.table_rows)

    def _read_config(self) -> SafetensorsDir:
        """config.json (self.cfg), the pooling, what a hybrid model's state allows, the context length and this
        rank's shard; returns the checkpoint's tensors."""
        args, model_dir, tp = self.args, self.model_dir, self.tp
        self.cfg = cfg = ModelConfig.from_dir(model_dir, args.model_impl, args.trust_remote_code)
        tensors = SafetensorsDir(model_dir)
        if cfg.vision is not None:  # the decoder reads the text model's tensors under a causal LM's names
            tensors = VisionTextTensors(tensors)
        if cfg.quant is not None:  # a pre-quantized checkpoint: loaded on its exact values (model/prequant/)
            tensors = prequant_tensors(cfg.quant, tensors, args, tp)
        if cfg.num_labels and not args.is_embedding:  # a sequence classifier is a pooling model (vLLM's runner auto)
            self.args = args = args.replace(is_embedding=True)
        # --is-embedding: the directory's pooling (refused by name where not implemented); a bare encoder
        # checkpoint (transformers' *Model: no lm_head) ties the head it never uses for embeddings
        self.pooling = read_pooling_config(model_dir) if args.is_embedding else None
        if args.is_embedding and not cfg.tie_word_embeddings and "lm_head.weight" not in tensors:
            self.cfg = cfg = dataclasses.replace(cfg, tie_word_embeddings=True)
        if cfg.linear_attn is not None:  # what a recurrent state allows (model/executor/hybrid_args.py)
            self.args = args = check_hybrid_args(args, cfg)
        elif args.max_mamba_cache_size is not None:
            raise ValueError("max_mamba_cache_size applies to hybrid models (Qwen3-Next, Qwen3.5, Granite 4.0-H, "
                             f"Nemotron-H); {cfg.architecture} keeps no recurrent state")
        self.context_len = args.context_length or cfg.max_position_embeddings
        cfg.check_context_len(self.context_len)  # a family's math that holds only up to some context
        self.shard = make_shard(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size,
                                cfg.vocab_size, tp.size if tp else 1, tp.rank if tp else 0)
        return tensors

    def _load_model(self, tensors: SafetensorsDir) -> torch.nn.Module:
        """The attention backend, the family's model with its weights, the quantization it runs with."""
        args, cfg, shard, tp, model_dir = self.args, self.cfg, self.shard, self.tp, self.model_dir
        backend = create_attention_backend(args.attention_backend, shard.q_count, shard.kv_count, cfg.head_dim,
                                           cfg.attn_scale or cfg.head_dim ** -0.5)
        backend.set_layer_options(cfg.layer_windows, cfg.attn_logit_softcapping or 0.0)  # windows, soft-cap
        backend.set_layer_chunks(cfg.layer_chunks)  # chunked local attention (refused where not implemented)
        self.backend = backend
        model_cls = family_for(cfg.architecture, cfg.model_impl).model_class  # config.json's (model/models/)
        quant = resolve_quantization(args, model_dir, model_cls, self.device.type)  # a .gguf's blocks by default
        self.dtype = gguf_blocks_dtype(args.dtype, self.dtype, self.device) if quant == "gguf" else self.dtype
        rotary = Rotary(cfg.rope, self.context_len, self.device, self.dtype)
        model = build_on_meta(lambda: model_cls(cfg, backend, rotary, shard, tp.all_reduce if tp else None),
                              self.dtype, self.device)
        model.load_hf_state_dict(tensors)
        self.images = image_features(cfg, args, tp, tensors, self.dtype, self.device)  # None: text only
        # pooled hidden states: families whose forward is Llama's (final_hidden is its first half)
        self.pools_hidden = type(model).forward is LlamaForCausalLM.forward
        for flag, on in (("--is-embedding", args.is_embedding),
                         ("--enable-return-hidden-states", args.enable_return_hidden_states)):
            if on and not self.pools_hidden:
                raise ValueError(f"{flag} is not implemented for {cfg.architecture} ({cfg.model_impl} "
                                 "implementation): hidden states are served for the Llama-family decoders")
        if quant != args.quantization:
            self.args = args = args.replace(quantization=quant)
        return model

    def _plan_paths(self, model: torch.nn.Module, tensors: SafetensorsDir) -> None:
        """Which implementation runs each op on this CPU (self.cpu_paths: packed / int8 / GGUF linears, the C
        norm and attention kernels, the deterministic mode, the fused decode layer), and the model set to it."""
        args, cfg, shard, backend = self.args, self.cfg, self.shard, self.backend
        native = cfg.model_impl == "native"  # transformers' modules: no packed linears, no C norm / decode layer
        packed = (packing_available(self.device, self.dtype) and args.quantization is None and native
                  and cfg.quant is None)
        if cfg.quant is not None:
            n = swap_linears(model, tensors.records, dense_tiles_available(self.device, self.dtype))
            logger.info("%s: %d linears run on the checkpoint's quantized weights", cfg.quant.describe(), n)
        if args.quantization == "int8":
            logger.info("int8 weight-only quantized %d linear weights", model.quantize_int8())
        elif args.quantization == "gguf":
            blocks = gguf_file_blocks(self.model_dir, self.tp is not None)
            self.gguf_types = sorted({fmt for _, fmt in blocks.values()})
            logger.info("%d linear weights run on the GGUF file's blocks", model.use_gguf_blocks(blocks))
        # the deterministic mode takes tiles only where they serve every batch size (their rows are then
        # batch-invariant by construction: gemv_dense.c), never beside oneDNN's GEMM for larger batches
        tiles = packed and dense_tiles_available(self.device, self.dtype) and (
            not args.enable_deterministic_inference or cpu_ops.dense_any_m(self.dtype, cpu_ops.load()))
        if packed:
            logger.info("prepacked %d linear weights for oneDNN", model.pack_for_cpu(tiles))
        self.cpu_paths = cpu_ops.plan(self.device, self.dtype, cfg.head_dim, shard.q_count, shard.kv_count, packed,
                                      tiles, backend.layer_shapes)
        if cfg.quant is not None:
            self.cpu_paths = dataclasses.replace(self.cpu_paths, linear=prequant_paths(cfg.quant, model))
        if args.quantization is not None:
            self.cpu_paths = dataclasses.replace(self.cpu_paths, linear=quantized_linear_paths(
                args.quantization, model, self.dtype, self.device, getattr(self, "gguf_types", [])))
        if not native:
            self.cpu_paths = dataclasses.replace(self.cpu_paths, norm="transformers", activation="transformers")
        if cfg.attn_logit_softcapping and (self.cpu_paths.c_decode or self.cpu_paths.c_extend):
            # the C attention kernels have no soft-cap: the torch path runs (TorchAttentionBackend.configure)
            self.cpu_paths = dataclasses.replace(self.cpu_paths, decode_attention="torch:soft-cap",
                                                 extend_attention="torch:soft-cap")
        if cfg.mla is not None:  # model/layers/mla_attention.py (not the backend's kernels: c_decode stays off)
            decode = (model.use_triton_kernels() if args.attention_backend == "triton"  # before enable_cpu_ops
                      else f"mla-absorbed:c:{detect().isa}" if self.cpu_paths.c_norm_act else "mla-absorbed:torch")
            self.cpu_paths = dataclasses.replace(self.cpu_paths, decode_attention=decode,
                                                 extend_attention="mla-expanded:torch")
        if self.cpu_paths.c_norm_act:
            model.enable_cpu_ops()
        if cfg.linear_attn is not None and native:  # model/layers/gated_deltanet.py, mamba2.py
            if args.attention_backend == "triton" and hasattr(model, "use_triton_kernels"):
                model.use_triton_kernels()
            mixers = [m for m in model.modules() if isinstance(m, (GatedDeltaNet, Mamba2Mixer))]
            triton = any(isinstance(m, GatedDeltaNet) and m.use_triton for m in mixers)
            c = any(m.use_cpu_kernel for m in mixers)
            decode = f"c:{detect().isa}" if c else "triton" if triton else "torch"
            prefill = {"torch": "torch:chunked", "triton": "triton:recurrent"}.get(decode, f"{decode}:recurrent")
            if any(isinstance(m, Mamba2Mixer) for m in mixers):  # Mamba2's extend: the torch chunked scan
                prefill = "torch:chunked"
            self.cpu_paths = dataclasses.replace(self.cpu_paths, linear_attention=f"decode {decode}, prefill {prefill}")
        if hasattr(backend, "configure"):
            backend.configure(self.cpu_paths)
        if args.enable_deterministic_inference and not native:
            raise ValueError("--enable-deterministic-inference is not supported with the transformers implementation "
                             f"({cfg.architecture}: transformers' modules are not batch-invariant)")
        if args.enable_deterministic_inference:
            deterministic.enable(model, backend, self.cpu_paths, self.device, self.dtype)
        if self.device.type == "cpu" and self.cpu_paths.c_decode and native and cfg.linear_attn is None:
            model.fused_decode = FusedDecode.build(model, self.dtype)
            if model.fused_decode is not None:
                self.cpu_paths = dataclasses.replace(
                    self.cpu_paths, decode_layer=f"c:{detect().isa} (M <= {model.fused_decode.max_batch})")

    def _build_pools(self) -> None:
        """The KV pool (sized from memory after a warm-up, or from the flags), a hybrid model's state pool,
        the request rows, the sampler."""
        args, cfg, shard = self.args, self.cfg, self.shard
        self.available_after_warmup: Optional[int] = None
        if self._sizes_pool_from_memory():
            self._warm_up()
            self.available_after_warmup = kv_memory.mem_available()
        self.state_plan = (0, 0)  # hybrid models: (request, snapshot) state slots, set by _kv_slots
        num_slots = self._kv_slots()
        table_rows = args.max_running_requests or max(1, min(256, num_slots // 16))
        self.state_pool: Optional[StatePool] = None  # hybrid models: one state slot per request-table row
        self.state_snapshot_slots = 0  # then the prefix cache's snapshot slots (scheduler/state_cache.py)
        if cfg.linear_attn is not None:
            table_rows, self.state_snapshot_slots = self.state_plan
            self.state_pool = StatePool(table_rows + self.state_snapshot_slots, self._state_shape(), self.device)
        self.graph_off = graph_off_reason(self)
        pad = 0 if self.graph_off else 1  # the graph path's padding slot and table row, past the allocator's
        self.kv_pool = KVPool(num_slots + pad, dtype=self.dtype, device=self.device, table_rows=table_rows + pad,
                              context_len=self.context_len, **cfg.kv_pool_entry(shard.kv_start, shard.kv_count))
        self.sizes = RunnerSizes(num_slots, table_rows, self.context_len)
        seed = args.random_seed if args.random_seed is not None else 0
        self.sampler = Sampler(cfg.vocab_size, cfg.eos_token_ids, self.device, seed)
        self.verifying: Optional[VerifyStates] = None  # a hybrid model's verify step, until its keep_verified
        self.draft_model = None  # STANDALONE's / NEXTN's draft (speculative/): its mirror runs after each step

    def _load_loras(self, model) -> LoraModel:
        """--enable-lora: every projection wrapped (after packing and the fused decode layer's build, which
        read the base weights), then the --lora-paths adapters registered under their ids (model/lora_registry)."""
        if self.cfg.model_impl != "native":
            raise ValueError(f"enable_lora needs the native implementation ({self.cfg.architecture} runs on "
                             "transformers' modules)")
        if self.cfg.mla is not None:
            raise ValueError(f"enable_lora is not supported for {self.cfg.architecture} (multi-head latent attention "
                             "has no q / k / v projections to adapt)")
        if self.args.lora_backend == "triton" and (why := triton_lora_ready(self.device)):
            raise ValueError(why)
        lora = LoraModel(model, use_kernel=self.args.lora_backend == "csgmv", backend=self.args.lora_backend)
        self.loras = LoraRegistry(lora, self.cfg.num_hidden_layers, self.args.max_lora_rank, self.dtype,
                                  self.device, self.args.max_loaded_loras)
        self.loras.register_all(self.args.lora_paths)  # every rank the same (the same paths, in order)
        if self.tp is not None and self.tp.rank == 0:  # from here on the other ranks mirror rank 0's set
            self.loras.on_change = self.tp.broadcast_obj
        return lora

    def load_lora(self, name: str, path: str, busy: frozenset = frozenset()) -> int:
        """Load an adapter at run time (scheduler thread); its new id. busy: the running requests' (kept)."""
        if self.lora is None:
            raise ValueError("loading a LoRA adapter needs enable_lora")
        return self.loras.register(name, path, set(busy))

    def _kv_slots(self) -> int:
        a, cfg = self.args, self.cfg
        ps = a.page_size
        if a.max_total_tokens is not None:
            if cfg.linear_attn is not None:  # the states on top of the KV pool's tokens
                self.state_plan = state_slots(a)
            return a.max_total_tokens // ps * ps
        # Every rank of a tensor-parallel group must get the same number of slots: size by the
        # largest shard (ranks can hold one GQA group more than others).
        size = self.shard.size
        per_token = max(KVPool.bytes_per_token(dtype=self.dtype, **cfg.kv_pool_entry(*head_split(
            cfg.num_attention_heads, cfg.num_key_value_heads, size, r)[2:])) for r in range(size))
        if self.extra_kv is not None:
            per_token += KVPool.bytes_per_token(dtype=self.dtype, **self.extra_kv)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info()
            budget = int(free * (a.mem_fraction_static or 0.85))
        else:  # a tensor-parallel rank must not size by its own free memory: all ranks need equal pools
            budget = a.kv_cache_budget_bytes or kv_memory.cpu_kv_budget(a.mem_fraction_static,
                                                                         self.available_after_warmup)
        if cfg.linear_attn is not None:  # the state slots' share of the budget first (at most half of it)
            per_slot = self._state_shape().bytes_per_slot()
            self.state_plan = state_slots(a, per_slot, budget)
            budget -= sum(self.state_plan) * per_slot
        return max(ps, budget // per_token // ps * ps)

    def _state_shape(self) -> StateShape:
        ssm, conv = self.cfg.linear_attn.split(self.shard.size).state_shapes()  # this rank's heads' state
        return StateShape(self.cfg.linear_attn.num_linear, ssm, conv, self.dtype)

    def _sizes_pool_from_memory(self) -> bool:
        a = self.args
        return (self.device.type == "cpu" and self.tp is None and a.max_total_tokens is None
                and a.kv_cache_budget_bytes is None)

    def _warm_up(self, tokens: int = 256) -> None:
        """One prefill of `tokens` tokens on a throw-away pool, before the real pool is sized: its
        activations, oneDNN's primitives and the kernels' scratch are then part of the process (and
        the first request does not pay for them)."""
        n = max(1, min(tokens, self.args.max_prefill_tokens, self.context_len))
        cfg = self.cfg
        self.kv_pool = KVPool(n, dtype=self.dtype, device=self.device, table_rows=1, context_len=n,
                              **cfg.kv_pool_entry(self.shard.kv_start, self.shard.kv_count))
        self.state_pool = StatePool(1, self._state_shape(), self.device) if cfg.linear_attn is not None else None
        ids = [(i * 7919) % cfg.vocab_size for i in range(n)]
        self.run_step(StepInputs("extend", ids, list(range(n)), [0], [0], [n], [], [n - 1]))
        del self.kv_pool

    def memory_breakdown(self, touched_slots: int) -> dict:
        """What the process's memory consists of (model/memory.MemoryBreakdown); touched_slots from the allocator."""
        pool = self.kv_pool
        per_slot = pool.nbytes // max(1, pool.num_slots)
        return memory.MemoryBreakdown(
            weights=self.weights_bytes, kv_pool=pool.nbytes, kv_touched=touched_slots * per_slot,
            table=pool.req_to_token.numel() * pool.req_to_token.element_size(),
            available_after_warmup=self.available_after_warmup, rss=memory.rss_bytes(),
            peak_rss=memory.peak_rss_bytes()).to_dict()

    # ------------------------------------------------------------------ one step
    @torch.inference_mode()
    def forward(self, batch: ModelBatch) -> StepResult:
        """One step: the model on the batch's tokens, then sampling (grammar masks, draft verification) and
        logprobs. Only the scheduler's rank calls it (tensor parallel: it broadcasts the StepInputs)."""
        faults.maybe_raise("forward", batch.rids)
        result = StepResult()
        sample_idx = [i for i, s in enumerate(batch.samples) if s is not None]
        plans = plan_input_logprobs(batch) if batch.phase != "decode" else []
        ends = list(itertools.accumulate(len(x) for x in batch.extend_ids))
        # The head runs only on the rows that need logits: sampled positions (a request verifying a
        # draft: its last len(draft) + 1 positions), then logprob positions.
        counts = [1 + len(batch.samples[i].draft) for i in sample_idx]
        rows = [r for i, n in zip(sample_idx, counts) for r in range(ends[i] - n, ends[i])]
        S = len(rows)
        rows += [r for p in plans for r in p.rows]
        pool = plan_pooling(batch, ends) if batch.pools else None
        L = len(rows)
        if pool is not None:
            rows += pool.logit_rows  # token_logits read the head's logits at their last row
        step = mirrored = step_inputs(batch, rows)
        wanted = plan_hidden(batch, ends)  # return_hidden_states: after pooling's rows
        step.hidden_rows = (pool.hidden_rows if pool is not None else []) + hidden_rows(wanted)
        if self.draft_model is not None and self.draft_model.reads_hidden:  # speculation: no pooling, no wanted
            step.hidden_rows = list(range(len(step.input_ids)))
        # a hybrid model: a draft's rows keep their states for the rollback (verify_step.py)
        if pool is None and self.state_pool is not None:
            step.state_verify = state_verify_rows(batch, sample_idx, counts)
        elif pool is None and not plans and batch.phase != "decode":
            step = verify_as_decode(step, batch, counts)
        step.images = plan_images(batch) if batch.images else []
        step.mrope = (plan_mrope(batch, self.cfg.vision.merge) if self.cfg.mrope_section else None) or []
        if self.tp is not None:
            self.tp.broadcast_obj(step)
        logits, hidden = self._run(step, batch.phase == "decode")  # [R, V] fp32; [P, hidden] fp32 or None
        if plans:
            fill_input_logprobs(result, batch, plans, logits[S:L])
        if pool is not None:
            fill_pooled(result, pool, hidden, logits[L:], getattr(self.model, "classify_logits", None))
        if wanted:
            fill_hidden(result, wanted, hidden[len(pool.hidden_rows) if pool is not None else 0:])
        if S:  # none: non-final chunks and prefill-only requests
            sample_step(batch, sample_idx, counts, logits[:S], self.sampler, result)
        if step.state_verify:  # each verifying request's state := the state after its last kept position
            self.keep_verified(VerifyKeep(dict(result.accepted)))
        if self.draft_model is not None:  # the extend form: STANDALONE reuses its proposal's K/V by position
            self.draft_model.mirror(mirrored, hidden, result, sample_idx)
        return result

    def keep_verified(self, keep: VerifyKeep) -> None:
        """After a hybrid model's verify step: the states rolled back to what was kept (mem/verify_states.py);
        tensor parallel: rank 0 sends `keep` to the other ranks, which apply it the same way (tp_worker.py)."""
        if self.tp is not None and self.tp.rank == 0:
            self.tp.broadcast_obj(keep)
        verifying, self.verifying = self.verifying, None
        verifying.keep(self.state_pool, keep.accepted)

    @torch.inference_mode()
    def run_step(self, step: StepInputs, with_hidden: bool = False):
        """The model on one step: float32 logits [R, V] (tensor parallel: on rank 0; None elsewhere); with_hidden:
        (logits, the final hidden states of step.hidden_rows)."""
        return self._run(step) if with_hidden else self._run(step)[0]

    def _run(self, step: StepInputs, decode: bool = False) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """run_step's logits, and the final hidden states [P, hidden] (float32) of step.hidden_rows (None when
        there are none). Every rank runs the same ops (the hidden states are whole on each after the reduce).
        decode: the scheduler's decode step, which the graph path replays where it fits a bucket."""
        if self.graphs is not None and self.graphs.takes(step, decode):
            return self.graphs.run(step), None
        fb = self._build_forward_batch(step)
        self.backend.init_forward_metadata(fb)
        if step.images:
            self.images.place(fb, step.images)
        if step.mrope:
            fb.mrope_positions = torch.tensor(step.mrope, dtype=torch.int64, device=self.device)
        hidden = None
        if step.lora_ids:  # some request runs an adapter (else the base path, unchanged)
            self.loras.touch(step.lora_ids)
            self.lora.begin(step.lora_ids, step.extend_lens, self.device)
            fb.has_lora = True
        try:
            if not step.hidden_rows:  # every generation step: the model's forward as always
                logits = self.model(fb, logit_rows=torch.tensor(step.logit_rows, dtype=torch.int64,
                                                                device=self.device))
            else:
                R = len(step.logit_rows)
                rows = torch.tensor(step.logit_rows + step.hidden_rows, dtype=torch.int64, device=self.device)
                x = self.model.final_hidden(fb, rows)  # [R + P, hidden]
                hidden = x[R:].float()
                logits = self.model.head_logits(x[:R]) if R else x.new_zeros((0, self.shard.vocab_count)).float()
        finally:
            if step.lora_ids:
                self.lora.end()
        if self.tp is None:
            return logits, hidden
        return self.tp.gather_logits(logits, self.shard, self.cfg.vocab_size), hidden

    def keepalive(self) -> None:
        """Between steps (the request loop calls it every iteration): see TPGroup.keepalive."""
        if self.tp is not None:
            self.tp.keepalive()

    def _build_forward_batch(self, step: StepInputs) -> ForwardBatch:
        dev = self.device
        B = len(step.req_rows)
        req_rows = torch.tensor(step.req_rows, dtype=torch.int64, device=dev)
        prefix = torch.tensor(step.prefix_lens, dtype=torch.int64, device=dev)
        extend_lens = step.extend_lens
        out_loc = torch.tensor(step.out_loc, dtype=torch.int64, device=dev)
        input_ids = torch.tensor(step.input_ids, dtype=torch.int64, device=dev)
        if step.phase == "decode":
            positions = prefix
            row_of_token = req_rows
        else:
            lens = torch.tensor(extend_lens, dtype=torch.int64, device=dev)
            starts = torch.cumsum(lens, 0) - lens
            T = int(input_ids.shape[0])
            positions = torch.arange(T, device=dev) + torch.repeat_interleave(prefix - starts, lens)
            row_of_token = torch.repeat_interleave(req_rows, lens)
        # Record where each position's K/V lives: req_to_token[row, pos] = slot. Rows the scheduler
        # marked (a prefix from the cache, or slots swapped for the cache's) get their prefix rewritten.
        for row, slots in step.rewrites:
            self.kv_pool.req_to_token[row, : len(slots)] = torch.tensor(slots, dtype=torch.int64)
        self.kv_pool.req_to_token[row_of_token, positions] = out_loc
        seq_lens_cpu = [p + n for p, n in zip(step.prefix_lens, extend_lens)]
        if self.state_pool is not None:  # a request's state slot is its table row (mem/state_pool.py)
            for snapshot, slot in step.state_loads:
                self.state_pool.copy(snapshot, slot)
            if step.phase == "decode":  # a one-token prompt run as a decode row starts from zeros
                for row, p in zip(step.req_rows, step.prefix_lens):
                    if p == 0:
                        self.state_pool.clear(row)
            self.verifying = VerifyStates(self.state_pool, [(i, step.req_rows[i], step.extend_lens[i])
                                                            for i in step.state_verify]) if step.state_verify else None
            extra = dict(state_verify=self.verifying, state_pool=self.state_pool, state_slots=req_rows,
                         state_slots_cpu=list(step.req_rows),
                         state_fresh=[p == 0 for p in step.prefix_lens],
                         state_saves={i: (off, snap) for i, off, snap in step.state_saves})
        else:
            extra = {}
        return ForwardBatch(
            phase=step.phase, batch_size=B, input_ids=input_ids, positions=positions, out_loc=out_loc,
            req_rows=req_rows, seq_lens=prefix + torch.tensor(extend_lens, dtype=torch.int64, device=dev),
            seq_lens_cpu=seq_lens_cpu, prefix_lens_cpu=list(step.prefix_lens), extend_lens_cpu=extend_lens,
            kv_pool=self.kv_pool, **extra,
        )
