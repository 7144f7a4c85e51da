"""DecodeGraphs: decode steps replayed from CUDA graphs, one graph per batch-size bucket (docs/GPU.md).

At start (after the KV pool is built) each bucket's decode forward is captured over static buffers: one
[5, max_bs] int64 block (input ids, positions, KV slots written, request-table rows, sequence lengths) and the
rows the head reads. A decode step of B requests takes the smallest bucket >= B: its lists are copied into the
block's first B columns, the other bucket - B columns are padding (token 0 at position 0 of a table row and a
KV slot that only padding uses, sequence length 1), the graph replays, and rows 0 .. B-1 of its float32 logits
go to sampling (grammar masks and all, as on the eager path); the padding rows' logits are dropped.

The padding slot and row lie past the allocator's and the request table's sizes (the runner builds the pool
one slot and one row larger), so no request ever reads or writes them: the padding attends only to itself.
Under the graph the attention backend sizes its grid by the context length (ForwardBatch.graph_max_len) and
plans no cascade groups (they are host-side plans); everything else is the eager forward, unchanged.

--cuda-graph-emulate (CPU): the same buckets, padding, block and copy-in / copy-out, with the model's forward run
on the static buffers in place of the replay: the parity tests run the graph path's bookkeeping on the CPU.

Whole-runner exclusions (the runner decodes eagerly, the reason in /server_info's cuda_graph): tensor
parallelism, LoRA, hybrid recurrent-state models, multi-head latent attention, mixture-of-experts routing, the
transformers implementation, pooling models, the torch attention backend on CUDA; on CUDA a capture that fails
(an op the graph cannot hold) turns the graphs off with its error as the reason. Per step (counted by reason):
batches over the largest bucket, speculative verification (run as decode rows of an extend); prefill and mixed
steps stay eager.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch

from radixlang_runtime.cuda_graph_args import check_graph_device, graph_buckets
from radixlang_runtime.model.executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

IDS, POSITIONS, OUT_LOC, ROWS, SEQ_LENS = range(5)  # the static block's rows


@dataclass
class GraphInfo:
    """What /server_info and Engine.get_stats() report under "cuda_graph"."""

    mode: str  # "cuda" (captured graphs) | "emulate" (the graph path run eagerly) | "off"
    reason: str = ""  # mode off: why decode runs eagerly
    buckets: list[int] = field(default_factory=list)
    capture_s: float = 0.0  # wall time of every bucket's warm-up and capture
    capture_bytes: int = 0  # device memory the captures took (free memory before - after)
    replayed_steps: int = 0
    replays: dict[int, int] = field(default_factory=dict)  # bucket -> steps replayed with it
    padded_rows: int = 0  # padding rows run in all (their logits dropped)
    eager_steps: dict[str, int] = field(default_factory=dict)  # decode steps run eagerly, by reason

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def graph_off_reason(runner: Any) -> Optional[str]:
    """Why this runner decodes eagerly as a whole; None: the graph path runs (captured on CUDA, emulated on CPU)."""
    args, cfg = runner.args, runner.cfg
    if args.disable_cuda_graph:
        return "disable_cuda_graph"
    if runner.device.type != "cuda" and not args.cuda_graph_emulate:
        return f"device {runner.device.type} (cuda_graph_emulate runs the graph path eagerly)"
    for reason, on in (("tensor parallelism", runner.tp is not None), ("a pooling model", args.is_embedding),
                       ("enable_lora", args.enable_lora), ("a hybrid model's recurrent state", cfg.linear_attn),
                       ("multi-head latent attention", cfg.mla),
                       ("speculative_algorithm NEXTN (its draft reads every row's hidden state)",
                        args.speculative_algorithm == "NEXTN"),
                       ("mixture-of-experts routing (its expert counts are read on the host)", cfg.moe),
                       ("multimodal rope (a request's positions past its images)", cfg.mrope_section),
                       ("model_impl transformers", cfg.model_impl != "native"),
                       ("attention_backend torch on CUDA", runner.device.type == "cuda"
                        and args.attention_backend != "triton")):
        if on:
            return reason
    return None


def start_graphs(runner: Any) -> tuple[Optional["DecodeGraphs"], GraphInfo]:
    """The runner's graph path after its pools are built (runner.graph_off from graph_off_reason, which also sized
    the pool's padding slot and row): captured on CUDA, ready to emulate on CPU, or off with its reason."""
    check_graph_device(runner.args, runner.device.type)
    if runner.graph_off is not None:
        return None, GraphInfo("off", runner.graph_off)
    args = runner.args
    buckets = graph_buckets(args.cuda_graph_bs, args.cuda_graph_max_bs, runner.sizes.table_rows)
    try:
        graphs = DecodeGraphs(runner, buckets, capture=runner.device.type == "cuda")
    except RuntimeError as e:  # an op that cannot be captured (a host sync): decode runs eagerly, the reason shown
        logger.warning("CUDA graphs off: capture failed: %s", e)
        return None, GraphInfo("off", f"capture failed: {e}", buckets)
    return graphs, graphs.info


class DecodeGraphs:
    def __init__(self, runner: Any, buckets: list[int], capture: bool):
        self.runner, self.buckets, self.max_bs = runner, buckets, buckets[-1]
        pool = runner.kv_pool
        self.pad_slot = pool.num_slots - 1  # one past the allocator's slots
        self.pad_row = pool.req_to_token.shape[0] - 1  # one past the request table's rows
        pool.req_to_token[self.pad_row].fill_(self.pad_slot)
        dev = runner.device
        self.block = torch.zeros(5, self.max_bs, dtype=torch.int64, device=dev)
        self.block[OUT_LOC], self.block[ROWS], self.block[SEQ_LENS] = self.pad_slot, self.pad_row, 1
        self.logit_rows = torch.arange(self.max_bs, dtype=torch.int64, device=dev)
        self.graph_max_len = runner.context_len
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # bucket -> its graph's logits [bucket, V] (static)
        self.logits: Optional[torch.Tensor] = None  # emulation: the static logits [max_bs, V]
        self.info = GraphInfo("cuda" if capture else "emulate", buckets=list(buckets))
        if capture:
            self._capture_all()
        else:
            logger.info("decode graph path emulated on the CPU: buckets %s", ", ".join(map(str, buckets)))

    # ------------------------------------------------------------------ which steps
    def eager_reason(self, step: Any) -> Optional[str]:
        """Why this decode step runs eagerly; None: it replays."""
        B = len(step.req_rows)
        if B > self.max_bs:
            return "batch over the largest bucket"
        if step.lora_ids or step.hidden_rows or step.state_loads or step.state_saves:
            return "adapters, pooling or state in the step"
        if step.logit_rows != list(range(B)):
            return "logit rows other than one per request"
        return None

    def takes(self, step: Any, scheduled_decode: bool) -> bool:
        """Whether `step` replays; a decode step that does not is counted under its reason."""
        if step.phase != "decode":
            return False
        reason = "speculative verification" if not scheduled_decode else self.eager_reason(step)
        if reason is None:
            return True
        self.info.eager_steps[reason] = self.info.eager_steps.get(reason, 0) + 1
        return False

    def bucket(self, batch_size: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, batch_size)]

    # ------------------------------------------------------------------ one step
    def run(self, step: Any) -> torch.Tensor:
        """The decode step's float32 logits [B, V] (a view of the static output: read before the next step)."""
        B = len(step.req_rows)
        bucket = self.bucket(B)
        self._copy_in(step, bucket)
        if self.graphs:
            self.graphs[bucket].replay()
            out = self.outputs[bucket]
        else:
            seq_lens = [p + 1 for p in step.prefix_lens] + [1] * (bucket - B)
            out = self._forward(bucket, seq_lens)
            if self.logits is None:
                self.logits = out.new_empty(self.max_bs, out.shape[1])
            self.logits[:bucket].copy_(out)
            out = self.logits
        self.info.replayed_steps += 1
        self.info.replays[bucket] = self.info.replays.get(bucket, 0) + 1
        self.info.padded_rows += bucket - B
        return out[:B]

    def _copy_in(self, step: Any, bucket: int) -> None:
        """The step's lists into the block's first B columns, padding in the rest up to the bucket; the table
        records where each new K/V goes (the eager path's req_to_token write, real rows only)."""
        B, pad = len(step.req_rows), bucket - len(step.req_rows)
        pool = self.runner.kv_pool
        for row, slots in step.rewrites:
            pool.req_to_token[row, : len(slots)] = torch.tensor(slots, dtype=torch.int64)
        host = torch.tensor([step.input_ids + [0] * pad, step.prefix_lens + [0] * pad,
                             step.out_loc + [self.pad_slot] * pad, step.req_rows + [self.pad_row] * pad,
                             [p + 1 for p in step.prefix_lens] + [1] * pad], dtype=torch.int64)
        self.block[:, :bucket].copy_(host, non_blocking=True)
        blk = self.block
        pool.req_to_token[blk[ROWS, :B], blk[POSITIONS, :B]] = blk[OUT_LOC, :B]

    def _forward(self, bucket: int, seq_lens_cpu: list[int]) -> torch.Tensor:
        """The model's decode forward on the static buffers' first `bucket` columns: float32 logits [bucket, V]."""
        blk, runner = self.block, self.runner
        fb = ForwardBatch(phase="decode", batch_size=bucket, input_ids=blk[IDS, :bucket],
                          positions=blk[POSITIONS, :bucket], out_loc=blk[OUT_LOC, :bucket], req_rows=blk[ROWS, :bucket],
                          seq_lens=blk[SEQ_LENS, :bucket], seq_lens_cpu=seq_lens_cpu,
                          prefix_lens_cpu=[n - 1 for n in seq_lens_cpu], extend_lens_cpu=[1] * bucket,
                          kv_pool=runner.kv_pool, graph_max_len=self.graph_max_len)
        runner.backend.init_forward_metadata(fb)
        return runner.model(fb, logit_rows=self.logit_rows[:bucket])

    # ------------------------------------------------------------------ capture (CUDA)
    def _capture_all(self) -> None:
        """Every bucket, largest first, into one memory pool; the time and the memory taken go to the info
        and the start log."""
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        mempool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        with torch.inference_mode():
            for bucket in reversed(self.buckets):
                self._capture(bucket, mempool, stream)
        torch.cuda.synchronize()
        self.info.capture_s = time.perf_counter() - t0
        self.info.capture_bytes = max(0, free_before - torch.cuda.mem_get_info()[0])
        logger.info("CUDA graphs: %d decode buckets (%s) captured in %.2f s, %.1f MiB", len(self.buckets),
                    ", ".join(map(str, self.buckets)), self.info.capture_s, self.info.capture_bytes / 2**20)

    def _capture(self, bucket: int, mempool: Any, stream: Any) -> None:
        """Two eager runs on the side stream (Triton compiles, the allocator settles), then the capture; the
        block holds padding throughout, so the captures write only the padding slot."""
        seq_lens = [1] * bucket
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(bucket, seq_lens)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=mempool, stream=stream):
            self.outputs[bucket] = self._forward(bucket, seq_lens)
        self.graphs[bucket] = graph
