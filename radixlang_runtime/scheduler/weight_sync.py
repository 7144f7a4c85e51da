"""Weight updates on the scheduler thread: only while no request is queued, compiling or running (the caller
pauses new ones and waits, or aborts them, first: SGLang's order), then the prefix cache is emptied so no K/V
computed by the old weights is reused: every prefix pin is dropped (it locks stale K/V), the radix tree and every
hierarchical-cache tier (host memory, storage) are flushed, which leaves the KV allocator whole."""

from __future__ import annotations

import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)

BUSY = "requests are queued or running"


def drop_stale_cache(scheduler) -> None:
    """Unpin every prefix and flush the radix cache and all its tiers (the scheduler is idle)."""
    kv = scheduler.kv
    for pin_id in list(kv.pins):
        kv.unpin(pin_id, kv.pins[pin_id].owner)
    if not scheduler.flush_cache(None):
        raise RuntimeError("the prefix cache could not be flushed after the weight update")


def apply_weight_update(scheduler, update: Callable[[Any], int], what: str) -> tuple[bool, str]:
    """update(runner) -> tensors copied, run between two steps; (success, message). A refusal (ValueError,
    OSError) leaves the weights and the cache as they were, and so does any other failure of the loader (answered
    with its type, never fatal to the loop); BUSY while any request is in the scheduler."""
    if not scheduler.is_idle:
        return False, BUSY
    try:
        n = update(scheduler.runner)
    except (ValueError, OSError) as e:
        logger.warning("weight update from %s refused: %s", what, e)
        return False, f"Failed to update weights: {e}"
    except Exception as e:  # noqa: BLE001 - a checkpoint the loader chokes on: answered, the loop goes on
        logger.exception("weight update from %s failed", what)
        return False, f"Failed to update weights: {type(e).__name__}: {e}"
    drop_stale_cache(scheduler)
    logger.info("weights updated from %s (%d tensors); prefix cache flushed", what, n)
    return True, "Succeeded to update model weights."
