"""Server arguments: one dataclass, SGLang's flag names; argparse reads its defaults from it.

Importable without torch. "auto" values (dtype, memory sizes) are resolved by the model runner,
which knows the device and the model; the dataclass itself only validates what it can see.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field, fields
from typing import Literal, Optional

REDACTED = "<redacted>"


def need(cond: bool, msg: str) -> None:
    """A setting's check: ValueError naming it when it does not hold."""
    if not cond:
        raise ValueError(msg)

SchedulePolicy = Literal["lpm", "fcfs", "dfs-weight"]


@dataclass
class ServerArgs:
    # --- model ---
    model_path: Optional[str] = None  # None: the embedded default (SmolLM2-135M-Instruct GGUF)
    tokenizer_path: Optional[str] = None
    served_model_name: Optional[str] = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (auto: device.resolve_dtype / gguf_blocks_dtype)
    context_length: Optional[int] = None
    device: str = "auto"  # auto | cpu | cuda
    model_cache_dir: Optional[str] = None  # where GGUF conversions are cached
    # native: model/models/ (refused when no file); transformers: transformers' modeling code with attention in the
    # paged KV pool (models/transformers_fallback.py); auto: native where the registry has the family
    model_impl: str = "auto"
    trust_remote_code: bool = False  # the fallback may load a checkpoint's own modeling code (config.json auto_map)
    # pooling model (docs/EMBEDDINGS.md): /v1/embeddings and /encode serve pooled final hidden states (pooling from
    # a sentence-transformers directory's modules, else last token + L2 norm); generation routes answer 400
    is_embedding: bool = False
    # /v1/rerank and /v1/score on a generation server: a decoder reranker scored by P(yes) over the logits of
    # classifier_from_token (vLLM's name and order: "no,yes") at the last position of rerank_template rendered with
    # {query}, {document} (and {instruction}: rerank_instruction); None: Qwen3-Reranker's template
    rerank_template: Optional[str] = None
    rerank_instruction: str = "Given a web search query, retrieve relevant passages that answer the query"
    classifier_from_token: str = "no,yes"

    # --- http ---
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: Optional[str] = field(default=None, repr=False)  # never printed or served: to_public_dict
    max_request_body_bytes: int = 32 << 20  # larger bodies answer 413 (checked while the body is read)
    enable_metrics: bool = False
    # /metrics without the API key (a Prometheus scraper on a private network); by default --api-key guards it
    # as every route but /health*. Neither SGLang nor vLLM has the switch (vLLM leaves /metrics open)
    metrics_no_auth: bool = False
    log_requests: bool = False
    log_level: str = "info"
    chat_template: Optional[str] = None
    # images given as local files (file:// or a path) are read only under this directory (vLLM's flag); None: refused
    allowed_local_media_path: Optional[str] = None
    allowed_media_domains: Optional[list[str]] = None  # http(s) images only from these hosts (vLLM's); None: any
    limit_mm_per_prompt: Optional[str] = None  # vLLM's: a JSON object, {"image": N} (None: 16 images a prompt)
    # /v1/chat/completions with tools: the output's tool-call format (SGLang's names: hermes, qwen25, llama3,
    # mistral, pythonic); None: told from the chat template's markup (tool_parsers.detect_parser)
    tool_call_parser: Optional[str] = None
    # /v1/chat/completions: <think>...</think> -> message.reasoning_content (SGLang's names: deepseek-r1, qwen3);
    # None: the output is all content
    reasoning_parser: Optional[str] = None
    # /v1/completions `suffix`: the FIM layout (SGLang's names, fim_templates.py); None: told from the tokenizer
    completion_template: Optional[str] = None
    # SGLang's name: the OpenAI-shaped routes' defaults for unset sampling fields: "model" = generation_config.json's
    # (protocol/sampling_defaults.py), "openai" = the API's own; override_generation_config (vLLM's): a JSON object
    sampling_defaults: str = "model"
    override_generation_config: Optional[str] = None  # of generation_config fields merged over the file's (or a dict)
    # /v1/responses: the responses kept for previous_response_id and GET / DELETE (server/responses_store.py)
    responses_store_max_entries: int = 4096
    responses_store_max_bytes: int = 256 << 20
    responses_store_ttl: float = 3600.0  # seconds a stored response is kept
    frontend_port: int = 0  # the DSL's ZeroMQ link on tcp://host:port: 0 a free port (default), N that one, -1 off
    dashboard_show_text: bool = False  # /dashboard labels radix nodes with their text (off: sizes only)
    # SIGTERM / SIGINT: seconds the requests in flight may run on while new ones get 503 (0: they fail at
    # once). SGLang's flag; 25 s leaves 5 s of Kubernetes' default 30 s grace for the errors and the stop.
    graceful_shutdown_timeout: float = 25.0
    # /health answers 503 when a scheduler with requests in flight sends no heartbeat for this long (a
    # stuck step); one step would have to last this long to trip it (server/lifecycle.py)
    health_stall_timeout: float = 30.0

    # --- parallelism (model/executor/parallel.py, placement.py) ---
    tp_size: int = 1  # tensor-parallel ranks (gloo on CPU, NCCL on CUDA)
    dp_size: int = 1  # data-parallel replicas (each a TP group) behind one tokenizer manager and router
    nnodes: int = 1  # nodes the TP ranks span (tp_size / nnodes ranks each)
    node_rank: int = 0  # this node; nodes > 0 run ranks only, node 0 serves HTTP
    dist_init_addr: Optional[str] = None  # host:port of rank 0's rendezvous (None: a free local port)
    dist_timeout: float = 60.0  # seconds a collective may wait before the group counts as failed
    load_balance_method: str = "cache_aware"  # cache_aware | round_robin | shortest_queue (dp_size > 1)

    # --- memory ---
    mem_fraction_static: Optional[float] = None  # GPU: share of device memory for weights + KV; CPU: share of
    # the memory available after load + warm-up for the KV pool (default 0.4, then capped at 4 GiB: mem/kv_memory.py)
    max_total_tokens: Optional[int] = None  # KV pool size in tokens (overrides the memory budget)
    kv_cache_budget_bytes: Optional[int] = None  # CPU: bytes for the KV pool (default: from free memory, see above)
    page_size: Optional[int] = None  # None: 16 on CPU, 1 on GPU (see resolve_for_device)
    max_running_requests: Optional[int] = None
    max_mamba_cache_size: Optional[int] = None  # hybrid models: state slots (mem/state_pool.py); None: from the pool

    # --- scheduling ---
    max_prefill_tokens: Optional[int] = None  # None: 16384 on GPU, 4096 on CPU (see resolve_for_device)
    chunked_prefill_size: Optional[int] = None  # -1 disables chunking; None: 8192 on GPU, 4096 on CPU
    schedule_policy: str = "lpm"
    # SGLang's names: a request's `priority` orders the waiting queue (higher values first, or lower with
    # schedule_low_priority_values_first) and retracts running requests it outranks by at least the threshold
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    priority_scheduling_preemption_threshold: int = 10
    max_queued_requests: Optional[int] = None  # SGLang's: the waiting queue's cap (a full queue answers 503)
    disable_radix_cache: bool = False
    # --- hierarchical KV cache (mem/hicache.py): SGLang's names; L2 = a disk directory, L3 = Redis ---
    enable_hierarchical_cache: bool = False
    hicache_size: float = 4.0  # GB of the L2 disk tier (0: no L2; then L3 must be on)
    hicache_write_policy: str = "write_back"  # write_back (on eviction) | write_through (on every insert too)
    hicache_storage_backend: Optional[str] = None  # None / "file": L2 only | "redis": L2 + L3 at hicache_redis_url
    hicache_storage_dir: Optional[str] = None  # L2's directory (None: <cache root>/hicache/<model fingerprint>)
    hicache_redis_url: Optional[str] = None  # redis://host:port/db (needs hicache_storage_backend redis)
    hicache_load_policy: str = "faster"  # faster: skip a tier measured slower than recomputing | always
    # SGLang's JSON object of backend settings; here {"ttl_s": seconds}: an L3 record expires ttl_s after its
    # last write or read (Redis EX); needs hicache_storage_backend redis (other keys refused by name)
    hicache_storage_backend_extra_config: Optional[str] = None
    # the deployment secret that keys the records' MAC (mem/tiers/secret.py, docs/HICACHE.md): required with
    # hicache_storage_backend redis; without one L2 uses a random key of its own directory. Never printed or served
    hicache_secret: Optional[str] = field(default=None, repr=False)
    hicache_secret_file: Optional[str] = None  # a file holding the secret (its bytes, a trailing newline dropped)
    # vLLM's name: what retract_decode does with a retracted request's K/V. swap: its whole records go to the
    # hicache tiers, readmission loads them (needs enable_hierarchical_cache) | recompute: readmission recomputes
    # what L1 lost. None: swap with enable_hierarchical_cache, recompute without
    preemption_mode: Optional[str] = None
    enable_mixed_chunk: bool = False  # decode steps share the forward pass of prefill chunks
    # SGLang's names: plan step N+1 while step N's forward runs (scheduler/overlap.py); on by default on GPU;
    # on CPU it is off unless enable_overlap_schedule (docs/SERVER.md#overlap-schedule)
    disable_overlap_schedule: bool = False
    enable_overlap_schedule: bool = False
    new_token_ratio_init: float = 0.7
    new_token_ratio_min: float = 0.1
    new_token_ratio_decay: float = 0.001
    stream_interval: int = 1
    incremental_streaming_output: bool = False  # /generate streams text / output_ids as deltas
    random_seed: Optional[int] = None
    debug_check_integrity: bool = False  # the allocator / cache / table checks after every step

    # --- kernels / constraints ---
    attention_backend: str = "auto"  # auto: triton on CUDA, torch elsewhere
    # auto (the grammar's kind picks: constrained/backends.AUTO_PICK) | outlines | xgrammar | llguidance (pinned) |
    # none (constrained requests answer 400)
    grammar_backend: str = "auto"
    disable_jump_forward: bool = False  # constrained requests sample every token (same text, more passes)
    grammar_step_timeout: float = 1.0  # s: one grammar call (mask, matcher move) past it ends its request
    grammar_request_timeout: float = 30.0  # s: one request's grammar calls in all (docs/CONSTRAINED_LIMITS.md)
    # int8 (layers/quant_linear.py) | gguf: the file's blocks (a .gguf's default: loader/gguf_mode.py) | none
    quantization: Optional[str] = None
    enable_deterministic_inference: bool = False  # batch-invariant numerics (model/executor/deterministic.py)

    # --- speculative decoding (speculative_args.py, speculative/): SGLang's names ---
    speculative_algorithm: Optional[str] = None  # NGRAM | STANDALONE | NEXTN (EAGLE) | None (off)
    speculative_num_draft_tokens: Optional[int] = None  # k: most draft tokens per step (NGRAM default 16)
    speculative_ngram_min_match_window_size: Optional[int] = None  # shortest suffix looked up (default 1)
    speculative_ngram_max_match_window_size: Optional[int] = None  # longest suffix looked up (default 6)
    # no drafts while more requests decode (default 0: no limit; the per-step cost rule, drafter.trim_to_cost,
    # keeps only draft rows whose expected accepted tokens pay for them at the batch's size)
    speculative_disable_by_batch_size: Optional[int] = None
    # STANDALONE (speculative/draft_model.py, model_drafter.py; docs/SPECULATIVE.md): a draft model of the same
    # tokenizer (a HF directory or a .gguf) proposes speculative_num_steps tokens greedily per step; the target
    # verifies speculative_num_draft_tokens = num_steps + 1 rows (SGLang's relation at topk 1)
    speculative_draft_model_path: Optional[str] = None
    speculative_num_steps: Optional[int] = None  # draft tokens proposed per step (STANDALONE default 3)
    speculative_draft_model_quantization: Optional[str] = None  # the draft's --quantization (gguf: its Q4_1 blocks)
    # NEXTN (EAGLE without a draft path, as SGLang reads it for DeepSeek V3): the checkpoint's own
    # multi-token-prediction layer drafts (speculative/nextn_draft.py); one chain: topk 1 only
    speculative_eagle_topk: Optional[int] = None

    # --- prefill-decode disaggregation (radixlang_runtime/disagg/, docs/DISAGGREGATION.md): SGLang's names ---
    disaggregation_mode: str = "null"  # null (co-located) | prefill | decode
    disaggregation_bootstrap_port: Optional[int] = None  # prefill only: the bootstrap socket (None: 8998)
    disaggregation_transfer_backend: str = "zmq"  # zmq only (mooncake / nixl refused by name)
    disaggregation_transfer_timeout: float = 30.0  # s: bound on a request's registration / pool wait / transfer
    disaggregation_heartbeat_timeout: float = 1.0  # s of peer silence after which its transfers fail
    # decode: the prefills (host:port of their bootstrap sockets, comma-separated) it takes K/V from; None: any
    disaggregation_prefill_peers: Optional[str] = None
    # both roles: the bootstrap link's shared secret (every message tagged with its HMAC), or a file holding it
    disaggregation_secret: Optional[str] = field(default=None, repr=False)
    disaggregation_secret_file: Optional[str] = None

    # --- LoRA adapters (lora_spec.py, model/layers/lora_linear.py, docs/LORA.md): SGLang's names ---
    enable_lora: bool = False
    lora_paths: Optional[list[str]] = None  # name=path (peft adapter directories); numbered 1, 2, ... in order
    max_lora_rank: Optional[int] = None  # None: the largest rank of the adapters given
    max_loras_per_batch: int = 8  # distinct adapters in one running batch (the base model not counted)
    max_loaded_loras: Optional[int] = None  # resident adapters (LRU eviction, read again on use); None: all
    lora_backend: str = "csgmv"  # csgmv: the C segment kernel where it measured faster; torch_native: torch only

    # --- CUDA graphs (cuda_graph_args.py, model/executor/graph_runner.py, docs/GPU.md): SGLang's names ---
    disable_cuda_graph: bool = False  # decode runs eagerly on CUDA too
    cuda_graph_max_bs: Optional[int] = None  # the largest bucket of the default ladder (None: 160)
    cuda_graph_bs: Optional[list[int]] = None  # the buckets captured (None: 1, 2, 4, 8, 12, 16, 24, ... max)
    cuda_graph_emulate: bool = False  # CPU: the graph path (buckets, padding, static buffers) run eagerly

    # --- request outputs (output_args.py): SGLang's names ---
    enable_return_hidden_states: bool = False  # requests may ask return_hidden_states (meta_info.hidden_states)

    def __post_init__(self) -> None:
        self._check_values()
        self._check_parallelism()
        self._check_limits()
        self._check_hicache()
        from radixlang_runtime.cuda_graph_args import check_cuda_graph_args  # the grouped checks: no torch
        from radixlang_runtime.disagg_args import check_disaggregation_args
        from radixlang_runtime.fim_templates import check_completion_template_arg
        from radixlang_runtime.lora_spec import check_lora_args
        from radixlang_runtime.output_args import check_output_args
        from radixlang_runtime.pooling import check_pooling_args
        from radixlang_runtime.protocol.sampling_defaults import check_sampling_defaults_args
        from radixlang_runtime.scheduling_args import check_scheduling_args
        from radixlang_runtime.speculative_args import check_speculative_args

        for check in (check_speculative_args, check_disaggregation_args, check_pooling_args, check_lora_args,
                      check_cuda_graph_args, check_scheduling_args, check_output_args, check_sampling_defaults_args):
            check(self)
        check_completion_template_arg(self.completion_template)

    def _check_values(self) -> None:
        """Each field's own values: choices and ranges."""
        need(self.dtype in ("auto", "float32", "bfloat16", "float16"),
             f"dtype must be one of auto, float32, bfloat16, float16; got {self.dtype!r}")
        need(self.model_impl in ("auto", "native", "transformers"),
             f"model_impl must be auto, native or transformers; got {self.model_impl!r}")
        need(self.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda; got {self.device!r}")
        need(self.page_size is None or self.page_size >= 1, f"page_size must be >= 1; got {self.page_size}")
        need(self.max_prefill_tokens is None or self.max_prefill_tokens >= 1, "max_prefill_tokens must be >= 1")
        need(self.chunked_prefill_size in (None, -1) or self.chunked_prefill_size >= (self.page_size or 1),
             "chunked_prefill_size must be -1 (off) or >= page_size")
        need(self.attention_backend in ("auto", "torch", "triton"),
             f"attention_backend must be auto, torch or triton; got {self.attention_backend!r}")
        need(self.grammar_backend in ("auto", "outlines", "xgrammar", "llguidance", "none"),
             f"grammar_backend must be auto, outlines, xgrammar, llguidance or none; got {self.grammar_backend!r}")
        need(self.grammar_step_timeout > 0, f"grammar_step_timeout must be > 0; got {self.grammar_step_timeout}")
        need(self.grammar_request_timeout > 0,
             f"grammar_request_timeout must be > 0; got {self.grammar_request_timeout}")
        from radixlang_runtime.tool_parsers import PARSERS  # no torch

        need(self.tool_call_parser is None or self.tool_call_parser in PARSERS,
             f"tool_call_parser {self.tool_call_parser!r}: known are {', '.join(sorted(PARSERS))}")
        from radixlang_runtime.reasoning_parser import REASONING_PARSERS  # no torch

        need(self.reasoning_parser is None or self.reasoning_parser in REASONING_PARSERS,
             f"reasoning_parser {self.reasoning_parser!r}: known are {', '.join(sorted(REASONING_PARSERS))}")
        need(self.quantization in (None, "none", "int8", "gguf"),
             f"quantization {self.quantization!r}: implemented are int8 (weight-only, per channel), none (a .gguf "
             "dequantized to float weights) and gguf (the .gguf model's own blocks)")

    def _check_parallelism(self) -> None:
        """TP / DP / nodes and the deterministic mode's limits there."""
        need(self.tp_size >= 1 and self.dp_size >= 1 and self.nnodes >= 1, "tp_size, dp_size and nnodes must be >= 1")
        need(self.tp_size % self.nnodes == 0,
             f"tp_size {self.tp_size} must be a multiple of nnodes {self.nnodes} (the same ranks on every node)")
        need(0 <= self.node_rank < self.nnodes, f"node_rank must be in [0, {self.nnodes}); got {self.node_rank}")
        need(self.nnodes == 1 or self.dist_init_addr is not None,
             "nnodes > 1 needs --dist-init-addr host:port (rank 0's node, reachable from every node)")
        # Flags tell the truth: what is not implemented is refused, not accepted and ignored.
        need(self.nnodes == 1 or self.dp_size == 1, "data parallelism over several nodes is not implemented "
             "(use dp_size 1 with nnodes > 1, or nnodes 1)")
        need(self.dist_timeout > 0, "dist_timeout must be > 0 seconds")
        need(0 <= self.graceful_shutdown_timeout < math.inf,
             f"graceful_shutdown_timeout must be a finite number of seconds >= 0; got {self.graceful_shutdown_timeout}")
        need(1.0 <= self.health_stall_timeout < math.inf,  # heartbeats come every 0.5 s: leave room for two
             f"health_stall_timeout must be a finite number of seconds >= 1; got {self.health_stall_timeout}")
        det = self.enable_deterministic_inference
        need(not det or self.quantization in (None, "none"), "enable_deterministic_inference runs unquantized weights "
             "only (quantized linears switch kernels with the batch size)")
        need(not det or self.tp_size == 1, "enable_deterministic_inference is not implemented with tp_size > 1")
        need(not det or self.device != "cuda", "enable_deterministic_inference is implemented for the CPU kernels "
             "only (not the Triton backend)")
        need(self.load_balance_method in ("cache_aware", "round_robin", "shortest_queue"),
             "load_balance_method must be cache_aware, round_robin or shortest_queue; "
             f"got {self.load_balance_method!r}")
        if self.dist_init_addr is not None:
            host, sep, port = self.dist_init_addr.rpartition(":")
            need(bool(sep and host and port.isdigit()),
                 f"dist_init_addr must be host:port; got {self.dist_init_addr!r}")

    def _check_limits(self) -> None:
        """Sizes, ports, timeouts and the request-facing limits."""
        need(self.max_total_tokens is None or self.max_total_tokens >= (self.page_size or 1),
             "max_total_tokens must be >= page_size")
        need(self.max_mamba_cache_size is None or self.max_mamba_cache_size >= 1, "max_mamba_cache_size must be >= 1")
        need(self.mem_fraction_static is None or 0.0 < self.mem_fraction_static < 1.0,
             "mem_fraction_static must be in (0, 1)")
        need(self.stream_interval >= 1, "stream_interval must be >= 1")
        need(isinstance(self.frontend_port, int) and -1 <= self.frontend_port <= 65535,
             "frontend_port must be 0 (a free port), a port 1..65535, or -1 (no ZeroMQ link); "
             f"got {self.frontend_port!r}")
        need(self.chat_template is None or "{{" in self.chat_template or "{%" in self.chat_template
             or os.path.isfile(self.chat_template),
             f"chat_template must be a Jinja template or the path of a file holding one; got {self.chat_template!r}")
        need(self.max_request_body_bytes >= 1024, "max_request_body_bytes must be >= 1024")
        need(self.allowed_local_media_path is None or os.path.isdir(self.allowed_local_media_path),
             f"allowed_local_media_path must be a directory; got {self.allowed_local_media_path!r}")
        self.images_per_prompt()  # limit_mm_per_prompt checked at start
        need(self.responses_store_max_entries >= 0 and self.responses_store_max_bytes >= 0
             and self.responses_store_ttl > 0, "responses_store_max_entries / _max_bytes must be >= 0 "
             "(0: nothing is stored), responses_store_ttl > 0")
        need(not self.metrics_no_auth or (self.enable_metrics and self.api_key),
             "metrics_no_auth needs enable_metrics and api_key (without a key /metrics is open anyway)")

    def _check_hicache(self) -> None:
        """Refuse hicache settings the runtime would not honour, by name."""
        if self.preemption_mode not in (None, "swap", "recompute"):
            raise ValueError(f"preemption_mode must be swap or recompute; got {self.preemption_mode!r}")
        if self.preemption_mode == "swap" and not self.enable_hierarchical_cache:
            raise ValueError("preemption_mode swap needs enable_hierarchical_cache (a retracted request's K/V is "
                             "swapped out to its tiers); without it retraction recomputes")
        given = [n for n, default in (("hicache_size", 4.0), ("hicache_write_policy", "write_back"),
                                      ("hicache_storage_backend", None), ("hicache_storage_dir", None),
                                      ("hicache_redis_url", None), ("hicache_load_policy", "faster"),
                                      ("hicache_storage_backend_extra_config", None),
                                      ("hicache_secret", None), ("hicache_secret_file", None))
                 if getattr(self, n) != default]
        if not self.enable_hierarchical_cache:
            if given:
                raise ValueError(f"{', '.join(given)} set without enable_hierarchical_cache")
            return
        if self.disable_radix_cache:
            raise ValueError("enable_hierarchical_cache needs the radix cache (drop disable_radix_cache)")
        if self.hicache_write_policy not in ("write_back", "write_through"):
            raise ValueError("hicache_write_policy must be write_back or write_through; "
                             f"got {self.hicache_write_policy!r}")
        if self.hicache_load_policy not in ("faster", "always"):
            raise ValueError(f"hicache_load_policy must be faster or always; got {self.hicache_load_policy!r}")
        backend = self.hicache_storage_backend
        if backend not in (None, "file", "redis"):
            raise ValueError(f"hicache_storage_backend {backend!r} is not implemented (file, redis)")
        if isinstance(self.hicache_size, bool) or not isinstance(self.hicache_size, (int, float)) \
                or not 0 <= self.hicache_size < float("inf"):
            raise ValueError(f"hicache_size must be a number of GB >= 0; got {self.hicache_size!r}")
        if backend == "redis" and not self.hicache_redis_url:
            raise ValueError("hicache_storage_backend redis needs hicache_redis_url")
        if backend != "redis" and self.hicache_redis_url:
            raise ValueError("hicache_redis_url set without hicache_storage_backend redis")
        if backend != "redis" and self.hicache_size == 0:
            raise ValueError("enable_hierarchical_cache with hicache_size 0 and no redis backend has no tier")
        self.hicache_extra_config()
        if self.hicache_mac_secret() is None and backend == "redis":
            raise ValueError("hicache_storage_backend redis needs hicache_secret or hicache_secret_file: the shared "
                             "tier is the one others can write, its records are sealed by a MAC under that secret")

    def hicache_mac_secret(self) -> Optional[bytes]:
        """The records' deployment secret (hicache_secret, or hicache_secret_file's bytes without a trailing
        newline), None when neither is given. ValueError names what is wrong."""
        if self.hicache_secret is not None and self.hicache_secret_file is not None:
            raise ValueError("give hicache_secret or hicache_secret_file, not both")
        if self.hicache_secret_file is not None:
            try:
                with open(self.hicache_secret_file, "rb") as f:
                    secret = f.read(1 << 16).rstrip(b"\r\n")
            except OSError as e:
                raise ValueError(f"hicache_secret_file {self.hicache_secret_file!r} cannot be read: {e}") from e
            name = "hicache_secret_file"
        elif self.hicache_secret is not None:
            secret, name = self.hicache_secret.encode(), "hicache_secret"
        else:
            return None
        if len(secret) < 16:
            raise ValueError(f"{name}: the secret must have at least 16 bytes; got {len(secret)}")
        return secret

    def hicache_extra_config(self) -> dict:
        """hicache_storage_backend_extra_config parsed: {} or {"ttl_s": float > 0} (redis only). ValueError
        names what is wrong."""
        raw = self.hicache_storage_backend_extra_config
        if raw is None:
            return {}
        name = "hicache_storage_backend_extra_config"
        try:
            cfg = json.loads(raw) if isinstance(raw, str) else None
        except ValueError as e:
            raise ValueError(f"{name} must be a JSON object: {e}") from e
        if not isinstance(cfg, dict):
            raise ValueError(f'{name} must be a JSON object such as {{"ttl_s": 3600}}; got {raw!r}')
        unknown = sorted(set(cfg) - {"ttl_s"})
        if unknown:
            raise ValueError(f"{name}: unknown key(s) {', '.join(map(repr, unknown))} (known: 'ttl_s')")
        ttl = cfg.get("ttl_s")
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < float("inf"):
                raise ValueError(f"{name} ttl_s must be a positive, finite number of seconds; got {ttl!r}")
            if self.hicache_storage_backend != "redis":
                raise ValueError(f"{name} ttl_s needs hicache_storage_backend redis (an L3 expiry); the file "
                                 "backend's L2 is bounded by hicache_size instead")
        return cfg

    def images_per_prompt(self) -> int:
        """limit_mm_per_prompt's image count (vLLM's flag: a JSON object of modality counts); 16 by default. Other
        modalities than image (none is served) must be 0."""
        if self.limit_mm_per_prompt is None:
            return 16
        try:
            limits = json.loads(self.limit_mm_per_prompt)
        except ValueError:
            limits = None
        if not isinstance(limits, dict) or not all(type(v) is int and v >= 0 for v in limits.values()):
            raise ValueError(f"limit_mm_per_prompt must be a JSON object of counts, e.g. '{{\"image\": 4}}'; got "
                             f"{self.limit_mm_per_prompt!r}")
        if other := sorted(k for k, v in limits.items() if k != "image" and v):
            raise ValueError(f"limit_mm_per_prompt: {other[0]} inputs are not served (only image)")
        return limits.get("image", 16)

    def speculative_chain_settings(self) -> tuple[int, int, int]:
        """STANDALONE's and NEXTN's draft chain: (num_steps, num_draft_tokens, batch size limit) with the defaults
        filled in: num_steps from itself, else num_draft_tokens - 1, else 3; no batch size limit unless given."""
        steps = self.speculative_num_steps
        if steps is None:
            steps = self.speculative_num_draft_tokens - 1 if self.speculative_num_draft_tokens is not None else 3
        cap = self.speculative_disable_by_batch_size
        return steps, steps + 1, 0 if cap is None else cap

    def speculative_ngram_settings(self) -> tuple[int, int, int, int]:
        """(k, min match, max match, batch size limit) with the NGRAM defaults filled in."""
        def pick(v: Optional[int], default: int) -> int:
            return default if v is None else v
        return (pick(self.speculative_num_draft_tokens, 16), pick(self.speculative_ngram_min_match_window_size, 1),
                pick(self.speculative_ngram_max_match_window_size, 6), pick(self.speculative_disable_by_batch_size, 0))

    def resolve_for_device(self, device_type: str) -> "ServerArgs":
        """Fill the None ("auto") sizes. On CPU, prefill batches of ~4K tokens keep the activations
        cache-resident: 64 x 256 tokens prefilled as 4 batches of 4096 ran 13% faster than as one
        batch of 16384 (elementwise ops on the larger tensors fall out of cache). Pages of 16 keep
        each request's KV in 16-slot runs: with single slots, decode steps of different requests
        interleave in the pool, and repeated 64-request runs decoded up to 25% slower as the free
        list scattered."""
        gpu = device_type == "cuda"
        return self.replace(
            page_size=self.page_size or (1 if gpu else 16),
            max_prefill_tokens=self.max_prefill_tokens or (16384 if gpu else 4096),
            chunked_prefill_size=self.chunked_prefill_size or (8192 if gpu else 4096),
            attention_backend=(("triton" if gpu else "torch") if self.attention_backend == "auto"
                               else self.attention_backend),
        )

    def replace(self, **changes) -> "ServerArgs":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Every field, the API key included: for other processes of this server only."""
        return dataclasses.asdict(self)

    def to_public_dict(self) -> dict:
        """What may be served (/server_info) or logged: the API key shows as "<redacted>" when set."""
        return {**self.to_dict(), "api_key": REDACTED if self.api_key else None,
                "hicache_secret": REDACTED if self.hicache_secret else None,
                "disaggregation_secret": REDACTED if self.disaggregation_secret else None}


def server_args_from_kwargs(model_path: Optional[str] = None, **kwargs) -> ServerArgs:
    """Engine(model_path=..., **server_args): unknown names raise a TypeError naming them."""
    known = {f.name for f in fields(ServerArgs)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"unknown server argument(s): {', '.join(unknown)}")
    return ServerArgs(model_path=model_path, **kwargs)
