"""What serving a hybrid model (recurrent layers with a state: model/layers/gated_deltanet.py, mamba2.py) allows.

A recurrent state cannot take tokens back once they are folded into it, so what runs tokens and then takes some
back keeps the state after each of them: a verify step (jump-forward's forced tokens of constrained decoding,
--speculative-algorithm NGRAM's drafts) runs a draft's DeltaNet rows position by position with the decode rule,
keeps the per-position states in scratch and rolls the request's slot back to the state after its last
accepted token (mem/verify_states.py, model/executor/verify_step.py); a state snapshot never holds a draft
token (scheduler/state_cache.py). STANDALONE (a draft model) is refused by name: its own runner would need the
same rollback for a hybrid draft model.
A cached prefix's K/V is not enough to continue from it, the state at its end is needed too: the prefix cache
keeps state snapshots in slots of its own (scheduler/state_cache.py, docs/HYBRID_MODELS.md); the hierarchical
cache's tiers store a node's snapshot with its K/V (mem/hicache.py backup_state) and serve a load only up to
the deepest one; prefill-decode disaggregation sends the request's state after its prompt with its K/V
(disagg/, mem/state_records.py). Retraction frees a request's state with its table row and the re-prefill
recomputes it (from a snapshot where one matches).
Tensor parallelism splits the linear-attention heads (each rank's state pool holds its heads' share) and the
deterministic mode runs them on batch-invariant C kernels (docs/HYBRID_MODELS.md); a feature the layers do not
honour (LoRA adapters on their projections, pooled embeddings, quantized weights) is refused by name.
"""

from __future__ import annotations

import logging
from typing import Optional

from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

DEFAULT_STATE_SLOTS = 32
SNAPSHOTS_PER_REQUEST_SLOT = 3  # the prefix cache's snapshot slots per request slot, by default


def check_hybrid_args(args: ServerArgs, cfg: ModelConfig) -> ServerArgs:
    """ValueError naming the first flag a hybrid model cannot honour; else the args, unchanged."""
    arch = cfg.architecture
    refused = (
        ("speculative_algorithm STANDALONE", args.speculative_algorithm == "STANDALONE"),
        ("enable_lora", args.enable_lora),
        ("is_embedding", args.is_embedding),
        ("quantization " + str(args.quantization), args.quantization is not None),
        # the tiers' and PD's state records hold rank 0's state pool only: its heads' share under TP
        ("enable_hierarchical_cache with tp_size > 1", args.enable_hierarchical_cache and args.tp_size > 1),
        ("disaggregation_mode with tp_size > 1", args.disaggregation_mode != "null" and args.tp_size > 1),
    )
    for name, on in refused:
        if on:
            raise ValueError(f"{name} is not supported for {arch}: its linear-attention layers keep a recurrent "
                             "state (docs/HYBRID_MODELS.md)")
    return args


def state_slots(args: ServerArgs, bytes_per_slot: int = 0, budget: Optional[int] = None) -> tuple[int, int]:
    """(request slots, snapshot slots) of the state pool. --max-mamba-cache-size is all of them (SGLang's
    name); the requests get --max-running-requests of them (default: a quarter, or DEFAULT_STATE_SLOTS when
    no size is given), the prefix cache's snapshots the rest (none with --disable-radix-cache). With a memory
    budget (bytes for KV + states) the states take at most half of it: the default sizes shrink to fit, an
    explicit --max-mamba-cache-size that does not fit is refused by name."""
    total = args.max_mamba_cache_size
    if args.disable_radix_cache:
        rows, snaps = min(args.max_running_requests or total or DEFAULT_STATE_SLOTS, total or 1 << 30), 0
    else:
        rows = args.max_running_requests or (max(1, total // 4) if total else DEFAULT_STATE_SLOTS)
        total = total or SNAPSHOTS_PER_REQUEST_SLOT * rows + rows
        rows = min(rows, total)
        snaps = total - rows
    if budget is None or (rows + snaps) * bytes_per_slot <= budget // 2:
        return rows, snaps
    fit = budget // 2 // max(bytes_per_slot, 1)
    if args.max_mamba_cache_size is not None or fit < 1:
        raise ValueError(f"max_mamba_cache_size: {rows + snaps} state slots of {bytes_per_slot} bytes take more than "
                         f"half of the memory budget ({budget} bytes); at most {fit} fit")
    rows = min(rows, max(1, fit // (1 + SNAPSHOTS_PER_REQUEST_SLOT)) if snaps else fit)
    snaps = min(snaps, fit - rows)
    logger.info("state pool shrunk to the memory budget: %d request slots, %d snapshot slots", rows, snaps)
    return rows, snaps
