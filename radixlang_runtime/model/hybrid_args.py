"""What serving a hybrid model (linear-attention layers with a recurrent state: model/gated_deltanet.py) allows.

A recurrent state cannot be rolled back: a step's tokens are folded into it for good. So every feature that
runs tokens and then takes some back is refused by name at start (speculative decoding: NGRAM, STANDALONE)
or turned off (jump-forward of constrained decoding: its forced tokens are verified like a draft), and so
is every feature that moves K/V without the state (hierarchical cache tiers, prefill-decode disaggregation).
The prefix cache is off for these models: a cached prefix's K/V is not enough to continue from it, the
state at its end is needed too (docs/HYBRID_MODELS.md). Retraction frees a request's state with its table
row and the re-prefill recomputes it.
"""

from __future__ import annotations

import dataclasses
import logging

from radixlang_runtime.model.config import ModelConfig
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)

DEFAULT_STATE_SLOTS = 32


def check_hybrid_args(args: ServerArgs, cfg: ModelConfig) -> ServerArgs:
    """ValueError naming the first flag a hybrid model cannot honour; the args with the prefix cache and
    jump-forward off."""
    arch = cfg.architecture
    refused = (
        ("speculative_algorithm", args.speculative_algorithm is not None),
        ("enable_hierarchical_cache", args.enable_hierarchical_cache),
        ("disaggregation_mode " + str(args.disaggregation_mode), args.disaggregation_mode != "null"),
        ("tp_size > 1", args.tp_size > 1),
        ("enable_lora", args.enable_lora),
        ("is_embedding", args.is_embedding),
        ("quantization " + str(args.quantization), args.quantization is not None),
        ("enable_deterministic_inference", args.enable_deterministic_inference),
    )
    for name, on in refused:
        if on:
            raise ValueError(f"{name} is not supported for {arch}: its linear-attention layers keep a recurrent "
                             "state (docs/HYBRID_MODELS.md)")
    if not args.disable_radix_cache:
        logger.info("%s: the prefix cache is off (a recurrent state is not cached with the K/V)", arch)
    if not args.disable_jump_forward:
        logger.info("%s: jump-forward is off (forced tokens cannot be taken back from a recurrent state)", arch)
    return dataclasses.replace(args, disable_radix_cache=True, disable_jump_forward=True)


def state_slots(args: ServerArgs) -> int:
    """How many requests can hold a state at once: --max-mamba-cache-size, capped by --max-running-requests."""
    slots = args.max_mamba_cache_size or args.max_running_requests or DEFAULT_STATE_SLOTS
    return min(slots, args.max_running_requests or slots)
