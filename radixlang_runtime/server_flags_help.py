"""The words of launch_server's --help: one help line per ServerArgs field, the choices of the fields that take
a fixed set, and the flags of SGLang / vLLM that radixlang does not implement with what to use instead.
tests/entrypoints/test_server_cli.py checks that every field has a line. No torch."""

from __future__ import annotations

HELP: dict[str, str] = {
    # model
    "model_path": "a Hugging Face directory (config.json + safetensors + tokenizer) or a .gguf file; "
                  "default: the embedded SmolLM2-135M-Instruct",
    "tokenizer_path": "the tokenizer's directory when it is not beside the weights",
    "served_model_name": "the model name /v1/models and the responses report (default: from the path)",
    "dtype": "weights' and activations' dtype; auto: bf16 where the CPU has bf16 dot products or on CUDA, "
             "and for a .gguf served on its blocks wherever the int8 kernels run; float32 elsewhere",
    "context_length": "the longest prompt + output (default: the model's)",
    "device": "where the model runs; auto: CUDA when present",
    "model_cache_dir": "where .gguf conversions are cached (default: ~/.cache/radixlang, or RADIXLANG_CACHE_DIR)",
    "model_impl": "auto: the native model file when radixlang has the architecture, else transformers' modeling "
                  "code with attention in the paged KV pool; native: refuse architectures without a file; "
                  "transformers: always the fallback",
    "trust_remote_code": "load a checkpoint's own modeling code (config.json auto_map) into the transformers "
                         "fallback; without it such a checkpoint is refused",
    "is_embedding": "serve a pooling model: /v1/embeddings, /encode, /v1/rerank, /v1/score (generation refused); "
                    "a sentence-transformers directory's pooling and normalization are read from it; a "
                    "*ForSequenceClassification checkpoint is a pooling model (/classify) without this flag too",
    "rerank_template": "the reranker's prompt with {query}, {document}, {instruction} (default: Qwen3-Reranker's)",
    "rerank_instruction": "the reranker prompt's {instruction}",
    "classifier_from_token": "the reranker's false and true tokens, scored at the prompt's last position",
    # http
    "host": "the address HTTP and the DSL's link listen on",
    "port": "the HTTP port",
    "api_key": "require 'Authorization: Bearer KEY' on every route but /health (never logged or served)",
    "max_request_body_bytes": "larger request bodies answer 413",
    "enable_metrics": "serve Prometheus metrics at /metrics (radixlang: and SGLang's sglang: names)",
    "metrics_no_auth": "serve /metrics without the API key (for scrapers on a private network)",
    "log_requests": "log every request's id, lengths and latency",
    "log_level": "the log level",
    "chat_template": "a Jinja chat template, or the path of a file holding one: the OpenAI chat route renders with "
                     "it and /get_model_info reports it (DSL programs render roles with it)",
    "allowed_local_media_path": "images given as local files (file:// URLs or paths) are read from this directory "
                                "only (default: refused)",
    "limit_mm_per_prompt": "the most images a prompt may hold, as vLLM's JSON object, e.g. '{\"image\": 4}' "
                           "(default 16)",
    "allowed_media_domains": "images given as http(s) URLs are fetched from these host names only, redirects "
                             "included (default: any host)",
    "tool_call_parser": "the tool-call format of the output (SGLang's names; vLLM's as aliases: minimax_m2, "
                        "minimax_m3, deepseek_v32, deepseek_v4, qwen3_xml, llama3_json, llama4_json, openai, "
                        "granite4, hunyuan_a13b, ernie45, cohere_command3); default: told from the chat template's "
                        "markup",
    "reasoning_parser": "split the reasoning block (<think>...</think>, [THINK]...[/THINK], <seed:think>..., gpt-oss: "
                        "the harmony analysis channel) into reasoning_content (SGLang's names, vLLM's as aliases); "
                        "default: all content",
    "completion_template": "the fill-in-the-middle token layout /v1/completions builds a `suffix` request's prompt "
                           "with (SGLang's names); default: told from the tokenizer's tokens",
    "sampling_defaults": "the OpenAI and Anthropic routes' defaults for sampling fields a request leaves unset: "
                         "model = the model's generation_config.json (temperature, top_p, top_k, min_p, "
                         "repetition_penalty, max_new_tokens as the default max_tokens), openai = the API's own",
    "override_generation_config": "a JSON object of those fields merged over generation_config.json's (with either "
                                  "--sampling-defaults), e.g. '{\"temperature\": 0.5, \"max_new_tokens\": 64}'; "
                                  "null drops the file's value; its max_new_tokens also lowers a request's larger "
                                  "max tokens to it, as vLLM's does",
    "frontend_port": "the DSL's ZeroMQ link, on --host: 0 = a free port, N = port N, -1 = no link. "
                     "/get_model_info reports the port; RuntimeEndpoint(http URL) finds it there",
    "dashboard_show_text": "label the live view's radix nodes with their text (off: sizes only)",
    "graceful_shutdown_timeout": "seconds the requests in flight may run on after SIGTERM / SIGINT while new ones "
                                 "get 503 (0: fail them at once)",
    "responses_store_max_entries": "/v1/responses kept for previous_response_id and GET / DELETE (0: none)",
    "responses_store_max_bytes": "bytes of stored /v1/responses (oldest evicted first)",
    "responses_store_ttl": "seconds a stored /v1/responses response is kept",
    "health_stall_timeout": "/health answers 503 when a scheduler with requests in flight sends no heartbeat "
                            "for this many seconds",
    # parallelism
    "tp_size": "tensor-parallel ranks (gloo on CPU, NCCL on CUDA)",
    "dp_size": "data-parallel replicas (each a TP group) behind one tokenizer manager",
    "nnodes": "nodes the TP ranks span",
    "node_rank": "this node (nodes > 0 run their ranks only; node 0 serves HTTP)",
    "dist_init_addr": "host:port of rank 0's rendezvous (default: a free local port)",
    "dist_timeout": "seconds a collective may wait before the group counts as failed",
    "load_balance_method": "how --dp-size replicas share requests",
    # memory
    "mem_fraction_static": "GPU: share of device memory for weights + KV; CPU: share of the memory available "
                           "after load for the KV pool (default 0.4, at most 4 GiB)",
    "max_total_tokens": "the KV pool's size in tokens (overrides the memory budget)",
    "kv_cache_budget_bytes": "CPU: bytes for the KV pool (default: from free memory)",
    "page_size": "tokens per KV page (default: 16 on CPU, 1 on GPU)",
    "max_running_requests": "most requests decoding at once (default: from the pool)",
    "max_mamba_cache_size": "hybrid models (Qwen3-Next, Qwen3.5, Granite 4.0-H, Nemotron-H): recurrent-state slots, "
                            "one per running request, taken from the memory budget (default: max_running_requests, "
                            "else 32)",
    # scheduling
    "max_prefill_tokens": "most prompt tokens in one prefill batch (default: 4096 on CPU, 16384 on GPU)",
    "chunked_prefill_size": "longest prefill chunk of one request, -1: no chunking (default: 4096 on CPU, "
                            "8192 on GPU)",
    "schedule_policy": "waiting-queue order: lpm = longest cached prefix first",
    "enable_priority_scheduling": "requests' `priority` orders the waiting queue before the policy, a waiting "
                                  "request retracts running ones it outranks by the threshold, and a prompt mid-way "
                                  "through chunked prefill yields to one that outranks it",
    "schedule_low_priority_values_first": "with priority scheduling: lower `priority` values first (vLLM's "
                                          "order; default: higher first, SGLang's)",
    "max_queued_requests": "the most requests that may wait for admission (waiting or compiling their grammar); "
                           "past it a new request answers 503, or, under priority scheduling, one of higher "
                           "priority drops the lowest waiting one (default: no cap)",
    "priority_scheduling_preemption_threshold": "how far a waiting request's priority must exceed a running "
                                                "one's to retract it (default 10)",
    "disable_radix_cache": "no prefix sharing (every prompt computed whole)",
    "enable_hierarchical_cache": "disk (L2) and Redis (L3) tiers under the radix tree",
    "hicache_size": "GB of the L2 disk tier (0: no L2; then L3 must be on)",
    "hicache_write_policy": "write_back: pages go to the tiers when evicted; write_through: when cached too",
    "hicache_storage_backend": "file: L2 only; redis: L2 + L3 at --hicache-redis-url",
    "hicache_storage_dir": "L2's directory (default: <cache root>/hicache/<model fingerprint>)",
    "hicache_redis_url": "redis://host:port/db of the L3 tier",
    "hicache_secret": "the deployment secret that authenticates the tiers' records (HMAC); needed with redis",
    "hicache_secret_file": "a file holding that secret",
    "hicache_load_policy": "faster: skip a tier measured slower than recomputing; always: load every hit",
    "hicache_storage_backend_extra_config": "a JSON object of backend settings; here {\"ttl_s\": seconds} for L3",
    "preemption_mode": "what retraction does with a request's K/V: swap it to the tiers or recompute it "
                       "(default: swap with the tiers, recompute without)",
    "enable_mixed_chunk": "decode steps share the forward pass of prefill chunks",
    "disable_overlap_schedule": "plan each step after the one before finished (no overlap schedule)",
    "enable_overlap_schedule": "overlap the scheduling of step N+1 with step N's forward pass on CPU too",
    "new_token_ratio_init": "the share of max_new_tokens reserved for running requests at first",
    "new_token_ratio_min": "the reserved share's floor",
    "new_token_ratio_decay": "how fast the reserved share decays after a retraction",
    "stream_interval": "tokens between streamed events",
    "incremental_streaming_output": "/generate streams text and output_ids as deltas",
    "random_seed": "the sampler's seed",
    "debug_check_integrity": "check the allocator, cache and table after every step (slow)",
    # kernels / constraints
    "attention_backend": "auto: triton on CUDA, torch (C kernels) elsewhere",
    "grammar_backend": "the engine of constrained decoding; auto: outlines for regex / JSON schema, xgrammar for EBNF "
                       "and structural tags (none: constrained requests answer 400)",
    "grammar_step_timeout": "seconds one grammar call (a mask, a forced string) may take; past it the request "
                            "ends alone",
    "grammar_request_timeout": "seconds of grammar work one request may spend in all",
    "disable_jump_forward": "sample every token of a constrained request (same text, more passes)",
    "quantization": "int8: weight-only per-channel int8; gguf: run a .gguf's own blocks (default for a .gguf "
                    "model path); none: dequantize a .gguf to float weights",
    "enable_deterministic_inference": "batch-invariant numerics: greedy output independent of batching",
    # speculative decoding
    "speculative_algorithm": "NGRAM: prompt lookup; STANDALONE: a draft model; NEXTN (or EAGLE without a draft "
                             "path): the checkpoint's multi-token-prediction layer (DeepSeek V3, GLM-4.5, "
                             "Qwen3-Next, Qwen3.5)",
    "speculative_num_draft_tokens": "most draft tokens verified per step (NGRAM default 16)",
    "speculative_ngram_min_match_window_size": "shortest suffix looked up (default 1)",
    "speculative_ngram_max_match_window_size": "longest suffix looked up (default 6)",
    "speculative_disable_by_batch_size": "no drafts while more requests decode (default 0: no limit; the cost "
                                         "rule steps aside by itself)",
    "speculative_draft_model_path": "STANDALONE: the draft model (same tokenizer; a HF directory or a .gguf)",
    "speculative_num_steps": "STANDALONE / NEXTN: draft tokens proposed per step (default 3)",
    "speculative_eagle_topk": "NEXTN: draft branches per step (1 only: one chain)",
    "speculative_draft_model_quantization": "STANDALONE: the draft's quantization (gguf: its own blocks)",
    # disaggregation
    "disaggregation_mode": "null: co-located; prefill or decode: one side of a disaggregated pair",
    "disaggregation_bootstrap_port": "prefill: the bootstrap socket's port (default 8998)",
    "disaggregation_transfer_backend": "how K/V travels between the pair",
    "disaggregation_prefill_peers": "decode: the prefills' bootstrap host:port list (comma-separated, IPv6 as "
                                    "[addr]:port) it takes K/V from; a request naming another answers 400",
    "disaggregation_secret": "prefill and decode: the bootstrap link's shared secret (every message carries its "
                             "HMAC; others are dropped)",
    "disaggregation_secret_file": "the bootstrap link's secret read from this file",
    "disaggregation_transfer_timeout": "seconds a request's registration, pool wait and transfer may take",
    "disaggregation_heartbeat_timeout": "seconds of peer silence after which its transfers fail",
    # LoRA
    "enable_lora": "serve LoRA adapters (implied by --lora-paths); see docs/LORA.md",
    "lora_paths": "adapters to serve, each name=path (a peft directory: adapter_config.json + "
                  "adapter_model.safetensors); a request picks one by lora_path or OpenAI model \"<base>:<name>\"",
    "max_lora_rank": "the largest adapter rank accepted (default: the largest of --lora-paths)",
    "max_loras_per_batch": "distinct adapters in one running batch; requests of others wait",
    "max_loaded_loras": "adapters held in memory (default: all); the least recently used idle one is evicted "
                        "and read again from its path when a request needs it",
    "lora_backend": "the adapters' delta math: csgmv (the C segment kernel on CPU where it measured faster, torch "
                    "elsewhere), torch_native (torch matmuls only) or triton (the Triton segment kernels: CUDA, "
                    "or CPU with TRITON_INTERPRET=1)",
    # CUDA graphs
    "disable_cuda_graph": "run decode eagerly on CUDA (default: one CUDA graph per batch-size bucket, replayed "
                          "for each decode step that fits one)",
    "cuda_graph_max_bs": "the largest decode batch replayed from a graph (default: 160, at most "
                         "--max-running-requests); larger batches run eagerly",
    "cuda_graph_bs": "the batch-size buckets captured, e.g. 1 2 4 8 16 (default: 1, 2, 4, 8, 12, then every 8 "
                     "from 16 up to --cuda-graph-max-bs)",
    "cuda_graph_emulate": "on the CPU: run decode through the graph path (the same buckets, padding and static "
                          "buffers) with an eager forward in place of the replay",
    # request outputs
    "enable_return_hidden_states": "requests may ask `return_hidden_states`: meta_info.hidden_states holds the "
                                   "final layer's hidden states (after the final norm) of the prompt and of each "
                                   "generated token but the last; not with speculative decoding or PD",
}

CHOICES: dict[str, tuple[str, ...]] = {
    "dtype": ("auto", "float32", "bfloat16", "float16"),
    "device": ("auto", "cpu", "cuda"),
    "model_impl": ("auto", "native", "transformers"),
    "log_level": ("debug", "info", "warning", "error"),
    # SGLang's names, then vLLM's aliases (tool_parsers.ALIASES)
    "tool_call_parser": ("hermes", "qwen25", "qwen", "llama3", "mistral", "pythonic", "qwen3_coder", "seed_oss",
                         "deepseekv3", "deepseekv31", "deepseekv32", "deepseekv4", "kimi_k2", "glm45", "glm47",
                         "minimax-m2", "minimax-m3", "step3", "gpt-oss", "minimax_m2", "deepseek_v32", "deepseek_v4",
                         "lfm2", "gemma4", "granite", "phi4_mini_json", "olmo3", "xlam", "kimi_k3", "jamba",
                         "internlm", "cohere_command4", "gigachat3", "longcat", "functiongemma", "apertus", "dots",
                         "minicpm5", "granite4", "hunyuan_a13b", "minimax_m3", "glm", "step3p5", "qwen3_xml",
                         "llama3_json", "llama4_json", "openai", "ernie45", "mimo", "apertus2509", "cohere_command3"),
    # SGLang's names, then vLLM's aliases (reasoning_parser.ALIASES)
    "reasoning_parser": ("deepseek-r1", "qwen3", "deepseek-v3", "qwen3-thinking", "glm45", "kimi", "kimi_k2",
                         "minimax", "step3", "step3p5", "mistral", "interns1", "mimo", "poolside_v1", "gpt-oss",
                         "deepseek_r1", "deepseek_v3", "minimax_m2", "seed_oss", "openai_gptoss"),
    "completion_template": ("star_coder", "qwen_coder", "deepseek_coder"),
    "sampling_defaults": ("model", "openai"),
    "load_balance_method": ("cache_aware", "round_robin", "shortest_queue"),
    "schedule_policy": ("lpm", "fcfs", "dfs-weight"),
    "hicache_write_policy": ("write_back", "write_through"),
    "hicache_storage_backend": ("file", "redis"),
    "hicache_secret": "the deployment secret that authenticates the tiers' records (HMAC); needed with redis",
    "hicache_secret_file": "a file holding that secret",
    "hicache_load_policy": ("faster", "always"),
    "preemption_mode": ("swap", "recompute"),
    "attention_backend": ("auto", "torch", "triton"),
    "grammar_backend": ("auto", "outlines", "xgrammar", "llguidance", "none"),
    "quantization": ("int8", "gguf", "none"),
    "speculative_algorithm": ("NGRAM", "STANDALONE", "NEXTN", "EAGLE"),
    "speculative_draft_model_quantization": ("gguf",),
    "disaggregation_mode": ("null", "prefill", "decode"),
    "disaggregation_transfer_backend": ("zmq",),
    "lora_backend": ("csgmv", "torch_native", "triton"),
}

# Flags of SGLang's or vLLM's launchers that radixlang does not take, and what to do instead.
FOREIGN_FLAGS: dict[str, str] = {
    "--model": "use --model-path (vLLM's positional model / --model)",
    "--tensor-parallel-size": "use --tp-size (vLLM's name)",
    "--pipeline-parallel-size": "pipeline parallelism is not implemented; use --tp-size",
    "--pp-size": "pipeline parallelism is not implemented; use --tp-size",
    "--data-parallel-size": "use --dp-size (vLLM's name)",
    "--max-model-len": "use --context-length (vLLM's name)",
    "--gpu-memory-utilization": "use --mem-fraction-static (vLLM's name)",
    "--max-num-seqs": "use --max-running-requests (vLLM's name)",
    "--max-num-batched-tokens": "use --max-prefill-tokens (vLLM's name)",
    "--block-size": "use --page-size (vLLM's name)",
    "--enable-prefix-caching": "prefix caching is always on (--disable-radix-cache turns it off)",
    "--no-enable-prefix-caching": "use --disable-radix-cache",
    "--generation-config": "use --sampling-defaults model (the default: generation_config.json's sampling fields) "
                           "or openai (vLLM's --generation-config vllm)",
    "--scheduling-policy": "use --schedule-policy; vLLM's `priority` policy is --enable-priority-scheduling "
                           "--schedule-low-priority-values-first",
    "--enable-chunked-prefill": "chunked prefill is always on (--chunked-prefill-size -1 turns it off)",
    "--seed": "use --random-seed",
    "--revision": "models are read from a local path; check out the revision into a directory",
    "--download-dir": "models are read from a local path (--model-path DIR)",
    "--load-format": "weights load from safetensors or GGUF by their file type",
    "--kv-cache-dtype": "the KV cache takes the model's dtype (--dtype)",
    "--lora-modules": "use --lora-paths name=path ... (SGLang's flag)",
    "--enforce-eager": "use --disable-cuda-graph (vLLM's name)",
    "--enable-torch-compile": "torch.compile is not used; the CPU path runs C kernels",
    "--skip-tokenizer-init": "the server always tokenizes; send input_ids to skip it per request",
    "--tokenizer-mode": "the model's fast tokenizer is always used",
    "--chunked-prefill": "use --chunked-prefill-size N",
    "--uvicorn-log-level": "use --log-level",
    "--disable-log-requests": "request logs are off by default (--log-requests turns them on)",
    "--enable-auto-tool-choice": "tool_choice auto works on every server; --tool-call-parser picks the format",
}
