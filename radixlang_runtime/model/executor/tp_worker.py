"""Tensor-parallel ranks > 0: a process that holds one shard of the model and runs the steps rank 0 broadcasts.

Rank layout: tp_size ranks over nnodes nodes, tp_size / nnodes per node, node n holding ranks
[n * k, (n + 1) * k). Rank 0 (node 0) is the scheduler (the server's scheduler process or the
Engine's loop thread); every other rank runs `run_tp_worker`.

Invariants:
- a worker runs exactly the StepInputs rank 0 broadcasts, in order; None is a keepalive, STOP ends it;
  KVRead / KVWrite (PD's K/V transfers, tp_kv.py), LoraResident (the adapters to hold, lora_registry.py) and
  VerifyKeep (after a hybrid model's verify step: mem/verify_states.py) come between steps, in the same order;
- a worker whose group fails (rank 0 gone, a peer gone, a timeout) exits with status 1 within the
  group's timeout, never lingers: a dead scheduler leaves no orphan ranks;
- a worker dies with the process that spawned it, even a SIGKILLed one (child_process.py).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Optional

from radixlang_runtime.utils.child_process import bind_to_parent
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


def free_local_addr() -> str:
    """127.0.0.1:<a free port> for a group whose ranks all run on this machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def local_ranks(args: ServerArgs) -> list[int]:
    """The TP ranks this node runs (rank 0 included on node 0)."""
    per_node = args.tp_size // args.nnodes
    return list(range(args.node_rank * per_node, (args.node_rank + 1) * per_node))


def set_cpu_threads(args: ServerArgs) -> None:
    """Model processes on one CPU share its cores: give each (TP rank, DP replica) cores / processes
    intra-op threads (unless OMP_NUM_THREADS says otherwise) so they do not oversubscribe. Called
    in processes of our own (the server's schedulers, TP workers), never in an Engine's host process."""
    import torch

    if args.tp_size * args.dp_size > 1 and "OMP_NUM_THREADS" not in os.environ:
        per_node = args.tp_size // args.nnodes * args.dp_size
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // per_node))


def make_group(args: ServerArgs, rank: int) -> Any:
    """Join the tensor-parallel group of args (args.dist_init_addr must be set). On CUDA each rank
    takes the GPU of its local index on the node."""
    import torch

    from radixlang_runtime.model.executor.parallel import TPGroup
    from radixlang_runtime.model.executor.device import resolve_device

    device = resolve_device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank % (args.tp_size // args.nnodes))
        torch.cuda.set_device(device)
    return TPGroup(rank, args.tp_size, args.dist_init_addr, args.dist_timeout, device)


def run_tp_worker(args: ServerArgs, rank: int, ready: Optional[Connection] = None,
                  parent_thread_lives: bool = True) -> None:
    """Process entry point of TP rank `rank` > 0. parent_thread_lives: the spawning thread lives as long
    as the spawning process (see bind_to_parent)."""
    bind_to_parent(parent_thread_lives=parent_thread_lives)
    logging.basicConfig(level=args.log_level.upper(), format=f"%(asctime)s tp{rank} %(levelname)s %(message)s")
    from radixlang_runtime.model.executor.parallel import STOP, ParallelFault
    from radixlang_runtime.model.loader.resolve import resolve_model_dir
    from radixlang_runtime.model.executor.runner import ModelRunner
    from radixlang_runtime.model.executor.tp_kv import KVRead, KVWrite, serve
    from radixlang_runtime.model.loader.lora_registry import LoraResident
    from radixlang_runtime.mem.verify_states import VerifyKeep

    try:
        set_cpu_threads(args)
        tp = make_group(args, rank)
        runner = ModelRunner(args, resolve_model_dir(args.model_path, args.model_cache_dir), tp)
        tp.wait_all_loaded()
    except Exception as e:  # noqa: BLE001 - reported to the launcher, then this rank exits
        logger.exception("tp rank %d failed to start", rank)
        if ready is not None:
            ready.send({"status": "error", "message": f"tp rank {rank}: {type(e).__name__}: {e}"})
        sys.exit(1)
    if ready is not None:
        ready.send({"status": "ready"})
    logger.info("tp rank %d/%d ready: %d q heads, %d KV heads", rank, args.tp_size, runner.shard.q_count,
                runner.shard.kv_count)
    while True:
        try:
            msg = tp.recv_obj()
            if msg is None:
                continue
            if msg == STOP:
                logger.info("tp rank %d: stop", rank)
                return
            if isinstance(msg, (KVRead, KVWrite)):  # PD: rank 0 reads / writes K/V of every rank (tp_kv.py)
                serve(runner, msg)
            elif isinstance(msg, LoraResident):  # LoRA: rank 0's resident adapters (lora_registry.py)
                runner.loras.mirror(msg)
            elif isinstance(msg, VerifyKeep):  # a hybrid model's verify step: the states to keep (verify_states.py)
                runner.keep_verified(msg)
            else:
                runner.run_step(msg)
        except ParallelFault as e:
            logger.error("%s: exiting", e)
            sys.exit(1)


def spawn_tp_workers(args: ServerArgs, ranks: list[int]) -> list[mp.Process]:
    """Start worker processes for `ranks` (> 0); they join the group at args.dist_init_addr. They die
    with this process; started from another thread than the main one (an Engine built on a worker
    thread), they watch the process, not the thread (bind_to_parent)."""
    ctx = mp.get_context("spawn")
    main_thread = threading.current_thread() is threading.main_thread()
    procs = []
    for r in ranks:
        p = ctx.Process(target=run_tp_worker, args=(args, r), kwargs={"parent_thread_lives": main_thread},
                        name=f"radixlang-tp{r}", daemon=True)
        p.start()
        procs.append(p)
    return procs
