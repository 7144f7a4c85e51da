"""The wiring above model/ and scheduler/: builds the model runner, then the scheduler (allocator, table, radix
cache, grammar queue, drafter) that drives it, from ServerArgs; stats that read both.

Shared by the in-process Engine (on its scheduler thread) and the server's scheduler process.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from radixlang_runtime.protocol.bootstrap_peers import parse_peers
from radixlang_runtime.lora_spec import parse_lora_paths
from radixlang_runtime.protocol.limits import RuntimeLimits
from radixlang_runtime.mem.allocator import PageAllocator
from radixlang_runtime.mem.hicache import HiCache, HiCacheConfig, record_tokens_for
from radixlang_runtime.mem.null_cache import NullPrefixCache
from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.mem.kv_prefault import KVPrefaulter
from radixlang_runtime.mem.state_slots import StateSlots
from radixlang_runtime.mem.table import TableManager
from radixlang_runtime.mem.verify_states import draft_cap
from radixlang_runtime.model.executor.runner import ModelRunner
from radixlang_runtime.speculative.drafter import ROW_COST, NgramConfig, NgramDrafter
from radixlang_runtime.scheduler.grammar_queue import GrammarQueue
from radixlang_runtime.scheduler.kv_manager import KVManager
from radixlang_runtime.scheduler.overlap import OverlapSchedule, overlap_off_reason
from radixlang_runtime.scheduler.preemption import PriorityRule
from radixlang_runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from radixlang_runtime.scheduler.state_cache import StateCache
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


def build_scheduler(args: ServerArgs, model_dir: str, tokenizer: Any,
                    peers_alive: Optional[Callable[[], bool]] = None) -> Scheduler:
    """tp_size > 1: this is rank 0 of the group at args.dist_init_addr; the other ranks
    (model/executor/tp_worker.py) are started by the caller and must load too before this returns
    (`peers_alive`: whether they still run, where the caller can see them)."""
    from radixlang_runtime.model.executor.tp_worker import make_group

    tp = make_group(args, 0) if args.tp_size > 1 else None
    runner = ModelRunner(args, model_dir, tp, extra_kv=draft_kv_shape(args, model_dir))
    if tp is not None:
        tp.wait_all_loaded(peers_alive)
    args = runner.args  # "auto" sizes resolved for the device
    sizes = runner.sizes
    eos = end_token_ids(model_dir, runner.cfg.eos_token_ids, tokenizer)
    runner.sampler.eos_token_ids = list(eos)  # the min_new_tokens mask and the finish check agree
    if tokenizer is not None:  # infill sampling's token pieces, built on its first row
        from radixlang_runtime.constrained.vocab import token_byte_table
        from radixlang_runtime.model.executor.infill_sampling import InfillStage

        runner.sampler.infill = InfillStage(lambda: token_byte_table(tokenizer, runner.cfg.vocab_size))
    grammar = None
    if args.grammar_backend != "none":
        backend = args.grammar_backend
        budget = (args.grammar_step_timeout, args.grammar_request_timeout)
        grammar = GrammarQueue(lambda: make_grammar_compiler(tokenizer, runner.cfg.vocab_size, backend, budget), eos,
                               jump_forward=not args.disable_jump_forward)
    allocator = PageAllocator(sizes.num_slots, args.page_size)
    start_kv_prefault(runner.kv_pool, allocator)
    radix = NullPrefixCache(args.page_size) if args.disable_radix_cache else RadixCache(args.page_size)
    states = None  # hybrid models: the prefix cache's state snapshots (scheduler/state_cache.py)
    if radix.shares and getattr(runner, "state_pool", None) is not None:
        states = StateCache(radix, StateSlots(sizes.table_rows, runner.state_snapshot_slots))
    scheduler = Scheduler(
        SchedulerConfig(
            page_size=args.page_size, context_len=sizes.context_len,
            max_running_requests=sizes.table_rows, max_prefill_tokens=args.max_prefill_tokens,
            chunked_prefill_size=args.chunked_prefill_size, eos_token_ids=eos,
            new_token_ratio_init=args.new_token_ratio_init, new_token_ratio_min=args.new_token_ratio_min,
            new_token_ratio_decay=args.new_token_ratio_decay, schedule_policy=args.schedule_policy,
            enable_mixed_chunk=args.enable_mixed_chunk, debug_check_integrity=args.debug_check_integrity,
            max_loras_per_batch=args.max_loras_per_batch,
            priority=PriorityRule(args.schedule_low_priority_values_first,
                                  args.priority_scheduling_preemption_threshold)
            if args.enable_priority_scheduling else None,
            max_queued_requests=args.max_queued_requests,
        ),
        runner,
        KVManager(allocator, TableManager(sizes.table_rows), radix,
                  hicache=make_hicache(args, runner, model_dir), states=states),
        detokenize=lambda ids: tokenizer.decode(ids),
        grammar=grammar,
        drafter=make_drafter(args, eos, sizes.context_len) if args.speculative_algorithm in (None, "NGRAM")
        else make_model_drafter(args, runner, model_dir, tokenizer, eos),
    )
    if getattr(runner, "state_pool", None) is not None:  # hybrid models: a verify step keeps every position's state
        scheduler.drafts.max_draft = draft_cap(runner.state_pool)
    if runner.loras is not None and args.max_loaded_loras is not None:  # evicted adapters read again on use
        # never evicting the adapter of a request whose K/V is on its way (PD: loras_in_use counts them)
        scheduler.admission.lora_residency = lambda lid, busy: runner.loras.ensure(lid, busy | scheduler.loras_in_use())
    off = overlap_off_reason(args, runner.device.type, states is not None)
    if off is None:
        scheduler.overlap = OverlapSchedule(scheduler)
    logger.info("overlap schedule: %s", "on (constrained requests' steps run without it)" if off is None
                else f"off: {off}")
    return scheduler


def start_kv_prefault(pool: Any, allocator: PageAllocator) -> None:
    """A lazily mapped CPU pool gets its fresh pages faulted in ahead of the allocator's frontier, off the
    scheduler's thread (mem/kv_prefault.py); the thread ends with the pool. Under TP only rank 0's pool."""
    if getattr(pool, "lazy", False):
        blocks = [g.block for g in pool.groups]
        pool.prefaulter = KVPrefaulter.for_pool(blocks, lambda: allocator.touched_pages * allocator.page_size)
        pool.prefaulter.start()


def make_disagg_role(args: ServerArgs, scheduler: Scheduler) -> Any:
    """--disaggregation-mode prefill | decode: the role (disagg/) set on the scheduler, its link thread started
    (the prefill's bootstrap socket bound on --host:--disaggregation-bootstrap-port: a taken port fails the start).
    Returns the link (close it at exit); None in mode null."""
    if args.disaggregation_mode == "null":
        return None
    from radixlang_runtime.disagg.decode import STEP_BYTES, DecodeRole
    from radixlang_runtime.disagg.link import BootstrapClient, BootstrapServer
    from radixlang_runtime.disagg.prefill import PrefillRole
    from radixlang_runtime.utils.link_key import link_key
    from radixlang_runtime.mem.kv_records import KVRecordPort
    from radixlang_runtime.model.executor.tp_kv import TPRecordPort

    runner = scheduler.runner
    # one-token records: any positions, any page size; under TP rank 0 moves every rank's heads (executor/tp_kv.py),
    # so the records are the same bytes at any tp_size and a prefill and a decode may differ in it
    port = KVRecordPort(runner.kv_pool, 1) if runner.tp is None else TPRecordPort(runner, 1)
    timeouts = (args.disaggregation_transfer_timeout, args.disaggregation_heartbeat_timeout)
    key = link_key(args.disaggregation_secret)  # every message tagged and checked (docs/DISAGGREGATION.md)
    if args.disaggregation_mode == "prefill":
        link = BootstrapServer(args.host, args.disaggregation_bootstrap_port, timeouts[1], key=key)
        scheduler.pd = PrefillRole(link, port, scheduler.kv, *timeouts, adapters=pd_adapters(args, scheduler))
    else:
        link = BootstrapClient(timeouts[1], key=key)
        # a CPU pool's writes share the decode's cores: a step budget per transfer; a device pool's do not
        step_bytes = STEP_BYTES if runner.kv_pool.device.type == "cpu" else None
        scheduler.pd = DecodeRole(link, port, scheduler.kv, *timeouts, scheduler.cfg.max_running_requests,
                                  step_bytes=step_bytes, vocab_size=runner.cfg.vocab_size,
                                  adapters=pd_adapters(args, scheduler))
    if getattr(runner, "state_pool", None) is not None:  # hybrid models: the recurrent state goes with the K/V
        from radixlang_runtime.mem.state_records import StateRecordPort

        scheduler.pd.state_port = StateRecordPort(runner.state_pool)
    link.start()
    return link


def pd_adapters(args: ServerArgs, scheduler: Scheduler) -> Any:
    """PD with LoRA: the adapters' names, content identities and batch bounds for the roles (disagg/adapters.py);
    None without --enable-lora (every transfer is then of the base model)."""
    loras = getattr(scheduler.runner, "loras", None)
    if loras is None:
        return None
    import os

    from radixlang_runtime.disagg.adapters import PDAdapters
    from radixlang_runtime.model.loader.resolve import cache_root

    def name_of(lora_id: int) -> Optional[str]:
        spec = loras.specs.get(lora_id)
        return None if spec is None else spec.name

    return PDAdapters(name_of, lora_identity(scheduler.runner, os.path.join(cache_root(), "hicache")),
                      args.max_loras_per_batch, scheduler.loras_in_use,
                      loras.ensure if args.max_loaded_loras is not None else None)


def make_hicache(args: ServerArgs, runner: ModelRunner, model_dir: str) -> Optional[HiCache]:
    """The tiers under the radix tree (--enable-hierarchical-cache): L2 disk, L3 Redis."""
    if not args.enable_hierarchical_cache:
        return None
    import os

    from radixlang_runtime.mem.kv_records import KVRecordPort
    from radixlang_runtime.mem.tiers.disk import DiskTier
    from radixlang_runtime.model.executor.tp_kv import TPRecordPort
    from radixlang_runtime.mem.tiers.keys import KVFingerprint, model_identity
    from radixlang_runtime.mem.tiers.redis_tier import RedisTier
    from radixlang_runtime.mem.tiers.secret import mac_key_from_secret
    from radixlang_runtime.model.loader.resolve import cache_root

    cfg = HiCacheConfig(record_tokens_for(args.page_size), args.hicache_write_policy,
                        load_policy=args.hicache_load_policy, preemption_mode=args.preemption_mode or "swap")
    if runner.tp is not None and runner.cfg.mla is not None:  # every rank holds the whole latent entry
        raise ValueError(f"enable_hierarchical_cache with tp_size {args.tp_size} is not implemented for "
                         f"{runner.cfg.architecture} (multi-head latent attention)")
    # under TP rank 0 moves every rank's heads (executor/tp_kv.py): a record holds all KV heads as at tp_size 1
    port = KVRecordPort(runner.kv_pool, cfg.record_tokens) if runner.tp is None else \
        TPRecordPort(runner, cfg.record_tokens)
    secret = args.hicache_mac_secret()
    mac_key = mac_key_from_secret(secret) if secret is not None else None  # None: L2's own directory key
    digest_dir = os.path.join(cache_root(), "hicache")
    identity = model_identity(model_dir, digest_dir)  # the weights' content hash
    heads, _, dim = runner.kv_pool.k_buffers[0].shape  # the pool's entry per token (MLA: one latent entry)
    if runner.tp is not None:
        heads = port.shape[2]  # the model's KV heads, every rank's
    fp = KVFingerprint(identity, str(runner.dtype).replace("torch.", ""), args.page_size,
                       cfg.record_tokens, runner.cfg.num_hidden_layers, heads, dim,
                       0, args.tp_size, args.quantization or "")
    state_pool = getattr(runner, "state_pool", None)  # hybrid models: snapshots are records too (any size:
    record_bytes = port.record_bytes if state_pool is None else None  # the ports check what they write)
    l2 = l3 = None
    if args.hicache_size > 0:
        directory = args.hicache_storage_dir or os.path.join(cache_root(), "hicache", fp.digest().hex())
        l2 = DiskTier(directory, int(args.hicache_size * 1e9), record_bytes, mac_key)
    if args.hicache_storage_backend == "redis":
        l3 = RedisTier(args.hicache_redis_url, fp.digest().hex(), record_bytes,
                       ttl_s=args.hicache_extra_config().get("ttl_s"), mac_key=mac_key)
    hicache = HiCache(cfg, fp, port, l2, l3, adapter_identity=lora_identity(runner, digest_dir))
    if state_pool is not None:
        from radixlang_runtime.mem.state_records import StateRecordPort

        hicache.state_port = StateRecordPort(state_pool)
    return hicache


def lora_identity(runner: ModelRunner, digest_dir: str) -> Callable[[int], Optional[str]]:
    """A LoRA adapter id -> its content identity (mem/tiers/keys.adapter_identity) for the tiers' keys; None for an
    adapter no longer registered or whose files cannot be read (its records are then neither stored nor read)."""
    from radixlang_runtime.mem.tiers.keys import adapter_identity

    def identity(lora_id: int) -> Optional[str]:
        spec = runner.loras.specs.get(lora_id) if runner.loras is not None else None
        if spec is None:
            return None
        try:
            return adapter_identity(spec.path, digest_dir)
        except OSError as e:
            logger.warning("LoRA adapter %r (%s) has no content identity (%s): its prefixes stay in L1 of the "
                           "hierarchical cache, and PD refuses its requests", spec.name,
                           spec.path, e)
            return None

    return identity


def make_drafter(args: ServerArgs, eos: tuple[int, ...], context_len: int) -> Optional[NgramDrafter]:
    if args.speculative_algorithm != "NGRAM":
        return None
    k, lo, hi, cap = args.speculative_ngram_settings()
    return NgramDrafter(NgramConfig(k, lo, hi, cap, ROW_COST), eos, context_len)


def draft_kv_shape(args: ServerArgs, model_dir: str) -> Optional[dict]:
    """STANDALONE / NEXTN: the draft's pool entry (ModelConfig.kv_pool_entry), so the target's pool sized from memory
    leaves the draft's pool (as many slots) its share."""
    if args.speculative_algorithm == "NEXTN":
        from radixlang_runtime.speculative.nextn_draft import nextn_config

        cfg = nextn_config(model_dir)
        return cfg.kv_pool_entry(0, cfg.num_key_value_heads)
    if args.speculative_algorithm != "STANDALONE":
        return None
    from radixlang_runtime.model.loader.config import ModelConfig
    from radixlang_runtime.model.loader.resolve import resolve_model_dir

    cfg = ModelConfig.from_dir(resolve_model_dir(args.speculative_draft_model_path), args.model_impl,
                               args.trust_remote_code)
    return cfg.kv_pool_entry(0, cfg.num_key_value_heads)


def make_model_drafter(args: ServerArgs, runner: ModelRunner, model_dir: str, tokenizer: Any,
                       eos: tuple[int, ...]) -> Any:
    """STANDALONE: the draft model beside the target (its pool mirrors the target's; speculative/draft_model.py),
    mirrored on the target's steps while drafting is on; NEXTN: the checkpoint's multi-token-prediction layer
    (speculative/nextn_draft.py), run behind every step. The scheduler's ModelDrafter proposes through either."""
    from radixlang_runtime.speculative.draft_model import DraftModel
    from radixlang_runtime.model.loader.resolve import resolve_model_dir
    from radixlang_runtime.speculative.model_drafter import ModelDraftConfig, ModelDrafter

    steps, _, cap = args.speculative_chain_settings()
    if args.speculative_algorithm == "NEXTN":
        from radixlang_runtime.speculative.nextn_draft import NextNDraft

        if not runner.pools_hidden:
            raise ValueError(f"speculative_algorithm NEXTN: {runner.cfg.architecture}'s hidden states are not served")
        runner.draft_model = nextn = NextNDraft.build(args, runner, model_dir)
        return ModelDrafter(ModelDraftConfig(steps, cap), nextn.propose, eos, runner.sizes.context_len, name="NEXTN")
    draft_dir = resolve_model_dir(args.speculative_draft_model_path)
    target_vocab = draft_vocab = None
    if tokenizer is not None and hasattr(tokenizer, "get_vocab"):
        from radixlang_runtime.model.loader.tokenizer import load_tokenizer

        target_vocab, draft_vocab = tokenizer.get_vocab(), load_tokenizer(draft_dir).get_vocab()
    draft = DraftModel.build(args, runner, draft_dir, target_vocab, draft_vocab)
    runner.draft_model = draft
    return ModelDrafter(ModelDraftConfig(steps, cap), draft.propose, eos, runner.sizes.context_len, draft.set_active)


def make_grammar_compiler(tokenizer: Any, logits_width: int, backend: str = "outlines",
                          budget: tuple[float, float] = (1.0, 30.0)) -> Any:
    """The token vocabulary of this tokenizer (built once, ~0.5 s) + a compiler (--grammar-backend; auto: one per
    backend, picked by each grammar's kind) whose compiled grammars are also cached on disk under the cache root
    (a restart reloads them in milliseconds); budget: the grammar calls' step and request time limits."""
    import os

    from radixlang_runtime.constrained.cache import GrammarCacheConfig, GrammarCompiler
    from radixlang_runtime.constrained.vocab import vocab_from_tokenizer
    from radixlang_runtime.model.loader.resolve import cache_root

    vocab = vocab_from_tokenizer(tokenizer, logits_width=logits_width)

    def make(name: str) -> GrammarCompiler:
        return GrammarCompiler(vocab, GrammarCacheConfig(disk_dir=os.path.join(cache_root(), "grammars"),
                                                      backend=name, step_timeout_s=budget[0],
                                                      request_timeout_s=budget[1]))

    if backend == "auto":  # the grammar's kind picks (constrained/auto_compiler.py)
        from radixlang_runtime.constrained.auto_compiler import KindRoutedCompiler

        return KindRoutedCompiler(make)
    return make(backend)


def end_token_ids(model_dir: str, config_eos: tuple[int, ...], tokenizer: Any) -> tuple[int, ...]:
    """The one set of end tokens: config.json's eos_token_id (int or list) + the tokenizer's EOS +
    generation_config.json's eos_token_id. Used by the Sampler (min_new_tokens) and the Scheduler."""
    import json
    import os

    eos = set(config_eos)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        eos.add(tokenizer.eos_token_id)
    gen_cfg = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(gen_cfg):
        with open(gen_cfg) as f:
            g = json.load(f).get("eos_token_id")
        eos.update(g if isinstance(g, list) else [] if g is None else [g])
    return tuple(sorted(eos))


def runtime_limits(scheduler: Scheduler, tokenizer: Any) -> RuntimeLimits:
    from radixlang_runtime.protocol.reasoning_watch import ThinkingMarkers
    from radixlang_runtime.protocol.sampling_defaults import max_tokens_cap

    runner = scheduler.runner
    markers = ThinkingMarkers.of_parser(runner.args.reasoning_parser, tokenizer)
    return RuntimeLimits(runner.sizes.context_len, runner.cfg.vocab_size, runner.sizes.num_slots,
                         grammar=scheduler.grammar is not None, grammar_backend=scheduler.runner.args.grammar_backend,
                         disaggregation_mode=runner.args.disaggregation_mode, is_embedding=runner.args.is_embedding,
                         disaggregation_prefill_peers=parse_peers(runner.args.disaggregation_prefill_peers),
                         lora_adapters=tuple(s.name for s in parse_lora_paths(runner.args.lora_paths)),
                         priority_scheduling=runner.args.enable_priority_scheduling,
                         sampling_defaults=tuple(model_sampling_defaults(runner).items()),
                         reasoning_parser=runner.args.reasoning_parser or "",
                         thinking_markers=markers.to_wire() if markers is not None else (),
                         speculative=runner.args.speculative_algorithm is not None,
                         hidden_states=runner.args.enable_return_hidden_states,
                         max_tokens_cap=max_tokens_cap(runner.args.override_generation_config),
                         **image_limits(runner.cfg.vision))


def image_limits(vision: Any) -> dict[str, Any]:
    """RuntimeLimits' image fields for a model's VisionSpec (multimodal/vision_spec.py; None: text only)."""
    if vision is None:
        return {}
    if vision.layout == "grid":  # each image at its own size
        return {"image_token_id": vision.image_token_id, "image_layout": "grid", "image_unit": vision.unit}
    if vision.layout == "patches":  # each image at its own size, as flattened patches of this many values
        t = vision.tower
        values = int(t.get("in_chans", t.get("in_channels", 3))) * int(t.get("temporal_patch_size", 2)) * \
            int(t.get("patch_size", 14)) ** 2
        return {"image_token_id": vision.image_token_id, "image_layout": "patches", "image_merge": vision.merge,
                "image_shape": (values,)}
    size = int(vision.tower.get("image_size", 224))
    return {"image_token_id": vision.image_token_id, "image_layout": vision.layout, "image_tokens": vision.tokens,
            "image_shape": (int(vision.tower.get("num_channels", 3)), size, size)}


def model_sampling_defaults(runner: Any) -> dict[str, Any]:
    """--sampling-defaults model: generation_config.json's sampling fields, --override-generation-config merged
    over them (logged once they apply)."""
    from radixlang_runtime.protocol.sampling_defaults import sampling_defaults

    args = runner.args
    found = sampling_defaults(runner.model_dir, args.sampling_defaults, args.override_generation_config)
    if found:
        logger.info("sampling defaults from the model's generation_config.json and --override-generation-config "
                    "(--sampling-defaults openai leaves the file out): %s", found)
    return found


def scheduler_stats(s: Scheduler) -> dict[str, Any]:
    """KV and scheduler counters (call on the scheduler's thread)."""
    kv = s.kv
    return {
        "total_slots": kv.allocator.total_slots, "free_slots": kv.allocator.available_size(),
        "cached_slots": kv.cached_size(), "evictable_slots": kv.evictable_size(),
        "num_running_reqs": len(s.running), "num_waiting_reqs": len(s.waiting) + (1 if s.chunked_req else 0),
        "prefill_tokens_computed": s.admission.prefill_tokens_computed,
        "prefill_tokens_cached": s.admission.prefill_tokens_cached,
        "num_retractions": s.num_retracted_total, "num_priority_preemptions": s.num_preempted_total,
        "forward_steps": s.forward_steps,
        "readmit_tokens": dict(s.admission.readmit_tokens),  # retracted requests: kept / swapped / recomputed
        "new_token_ratio": s.new_token_ratio,
        **kv.pin_stats(),  # pinned_slots (distinct slots the prefix pins lock), num_pins
        "num_grammar_waiting": len(s.grammar.pending) if s.grammar is not None else 0,
        "forced_tokens_total": s.grammar.forced_tokens_total if s.grammar is not None else 0,
        "spec_draft_tokens": s.drafts.spec_draft_tokens, "spec_accepted_tokens": s.drafts.spec_accepted_tokens,
        # NGRAM / STANDALONE: accepted draft tokens per verification (speculative/accept_stats.py); None without
        "spec_accept_length": s.drafts.drafter.accept_stats.to_dict() if s.drafts.drafter is not None else None,
        # the measured decode step cost per batch size regime (speculative/spec_cost.py); None without the rule
        "spec_step_cost": s.drafts.cost.to_dict() if s.drafts.cost is not None else None,
        # STANDALONE / NEXTN: the draft's counters (mirrored steps, proposals; STANDALONE's skipped steps, positions
        # caught up and copied; NEXTN's positions run)
        "spec_draft_model": draft_model_stats(s),
        "hicache": kv.hicache.stats() if kv.hicache is not None else None,  # mem/hicache.py: tiers' hits, bytes
        "disaggregation": s.pd.stats() if s.pd is not None else None,  # disagg/: transferred_tokens, failures
        # scheduler/overlap.py: steps planned while another ran, steps run without overlap; None: overlap off
        "overlap_schedule": s.overlap.stats() if s.overlap is not None else None,
        "grammar_cache": dict(s.grammar._compiler.stats) if s.grammar is not None and s.grammar._compiler else None,
        "cpu": runner_paths(s.runner),
        # LoRA adapters (model/loader/lora_registry.py): registered, resident (--max-loaded-loras), evictions, reloads
        "lora": s.runner.loras.stats() if getattr(s.runner, "loras", None) is not None else None,
        # hybrid models' recurrent-state slots (mem/state_pool.py; one per request-table row); None otherwise
        "state_pool": ({**s.runner.state_pool.info(kv.table.num_rows - kv.table.available),
                        **(kv.states.stats() if kv.states is not None else {})}
                       if getattr(s.runner, "state_pool", None) is not None else None),
        # decode under CUDA graphs (model/executor/graph_runner.GraphInfo): mode, buckets, capture time and memory
        "cuda_graph": s.runner.graph_info.to_dict() if getattr(s.runner, "graph_info", None) is not None else None,
        # model/memory.MemoryBreakdown (None for runners without one, e.g. the fakes of unit tests)
        "memory": (s.runner.memory_breakdown(kv.allocator.touched_pages * kv.allocator.page_size)
                   if hasattr(s.runner, "memory_breakdown") else None),
    }


def draft_model_stats(s: Scheduler) -> Optional[dict[str, int]]:
    """The draft's counters (speculative/draft_model.py, nextn_draft.py); None without a draft model."""
    draft = getattr(s.runner, "draft_model", None)
    if draft is None:
        return None
    return {**draft.stats(), "proposals": getattr(s.drafts.drafter, "draft_calls", 0)}


def runner_paths(runner: Any) -> dict[str, Any]:
    """What this CPU supports and which implementation runs each operation (cpu_ops.plan)."""
    from radixlang_kernels.cpu_caps import detect

    paths = getattr(runner, "cpu_paths", None)
    dtype = getattr(runner, "dtype", None)
    return {**detect().summary(), "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
            "paths": paths.to_dict() if paths is not None else None}
