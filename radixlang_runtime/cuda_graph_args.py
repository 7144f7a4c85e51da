"""The decode graphs' flags (SGLang's names: --disable-cuda-graph, --cuda-graph-max-bs, --cuda-graph-bs) and
--cuda-graph-emulate, checked once at the edge, and the batch-size buckets they give (torch-free; the graphs
themselves: model/executor/graph_runner.py, docs/GPU.md)."""

from __future__ import annotations

from typing import Any, Optional

DEFAULT_MAX_BS = 160  # the largest bucket when neither --cuda-graph-max-bs nor --cuda-graph-bs names one


def default_buckets(max_bs: int) -> list[int]:
    """SGLang's default ladder up to max_bs: 1, 2, 4, 8, 12, then every 8 from 16; max_bs itself is the last."""
    ladder = [b for b in (1, 2, 4, 8, 12, *range(16, max_bs + 1, 8)) if b <= max_bs]
    return ladder if ladder[-1] == max_bs else [*ladder, max_bs]


def graph_buckets(bs: Optional[list[int]], max_bs: Optional[int], table_rows: int) -> list[int]:
    """The buckets captured: --cuda-graph-bs as given (sorted), else the default ladder up to --cuda-graph-max-bs
    (default DEFAULT_MAX_BS); none above table_rows (no more requests decode at once), which then closes the list."""
    out = sorted(set(bs)) if bs else default_buckets(max_bs or DEFAULT_MAX_BS)
    kept = [b for b in out if b <= table_rows]
    return kept if len(kept) == len(out) or table_rows in kept else [*kept, table_rows]


def check_cuda_graph_args(args: Any) -> None:
    """ServerArgs' graph settings: values out of range, and settings that would not be honoured, refused by name."""
    if isinstance(args.cuda_graph_bs, int):
        args.cuda_graph_bs = [args.cuda_graph_bs]
    if args.cuda_graph_max_bs is not None and args.cuda_graph_max_bs < 1:
        raise ValueError(f"cuda_graph_max_bs must be >= 1; got {args.cuda_graph_max_bs}")
    if args.cuda_graph_bs is not None:
        if not args.cuda_graph_bs or any(not isinstance(b, int) or b < 1 for b in args.cuda_graph_bs):
            raise ValueError(f"cuda_graph_bs must be batch sizes >= 1; got {args.cuda_graph_bs}")
        if args.cuda_graph_max_bs is not None and max(args.cuda_graph_bs) > args.cuda_graph_max_bs:
            raise ValueError(f"cuda_graph_bs {max(args.cuda_graph_bs)} is above cuda_graph_max_bs "
                             f"{args.cuda_graph_max_bs}")
    sized = args.cuda_graph_bs is not None or args.cuda_graph_max_bs is not None
    if args.disable_cuda_graph and (sized or args.cuda_graph_emulate):
        named = "cuda_graph_emulate" if args.cuda_graph_emulate else (
            "cuda_graph_bs" if args.cuda_graph_bs is not None else "cuda_graph_max_bs")
        raise ValueError(f"{named} has no effect with disable_cuda_graph (drop one of them)")
    if args.cuda_graph_emulate and args.device == "cuda":
        raise ValueError("cuda_graph_emulate runs the graph path eagerly on the CPU; on CUDA the graphs are captured "
                         "(drop cuda_graph_emulate)")


def check_graph_device(args: Any, device_type: str) -> None:
    """Once the device is known (device auto): emulation on CUDA, or bucket sizes on a CPU without
    --cuda-graph-emulate, would not be honoured."""
    if device_type == "cuda" and args.cuda_graph_emulate:
        raise ValueError("cuda_graph_emulate runs the graph path eagerly on the CPU; on CUDA the graphs are captured "
                         "(drop cuda_graph_emulate, or pass device cpu)")
    if device_type != "cuda" and not args.cuda_graph_emulate and (
            args.cuda_graph_bs is not None or args.cuda_graph_max_bs is not None):
        raise ValueError("cuda_graph_bs / cuda_graph_max_bs apply to CUDA graphs; on the CPU add cuda_graph_emulate "
                         "to run the graph path eagerly")
