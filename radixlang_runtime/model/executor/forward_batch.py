"""ForwardBatch: the tensors of one step, built by the runner from its StepInputs (model/executor/runner.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from radixlang_runtime.mem.kv_pool import KVPool


@dataclass
class ForwardBatch:
    phase: str  # "extend" | "decode"
    batch_size: int  # B
    input_ids: torch.Tensor  # [T] int64, T = sum(extend_lens)
    positions: torch.Tensor  # [T] int64
    out_loc: torch.Tensor  # [T] int64 slots the new K/V go to
    req_rows: torch.Tensor  # [B] int64 rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64 prefix + extend
    seq_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    kv_pool: KVPool
    attn_meta: Optional[Any] = None  # set by the attention backend's init_forward_metadata
    rope_cos_sin: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # [T, 1, D] each, set by the model
    rope_cos_sin_local: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # Gemma 3: the sliding layers' rope
    # hybrid models (model/layers/gated_deltanet.py): the state pool, each request's slot ([B] tensor and list) and
    # whether its state starts from zeros this step (prefix length 0)
    state_pool: Optional[Any] = None
    state_slots: Optional[torch.Tensor] = None
    state_slots_cpu: list[int] = field(default_factory=list)
    state_fresh: list[bool] = field(default_factory=list)
    state_saves: dict[int, tuple[int, int]] = field(default_factory=dict)  # request index -> (offset, snapshot)
    state_verify: Optional[Any] = None  # a verify step's per-position states (mem/verify_states.VerifyStates)
    has_lora: bool = False  # some row runs a LoRA adapter (model/layers/lora_linear.py): the per-module path
    # a decode step under the graph path (executor/graph_runner.py): the bound on seq_lens that sizes the kernels'
    # grids in place of max(seq_lens_cpu) (no host sync, the same launch at every replay), cascade off; 0: eager
    graph_max_len: int = 0
    # images (executor/image_step.py): the flattened rows that are image positions and their embeddings [M, hidden],
    # which replace the embedding lookup there (models/llama.py)
    image_rows: Optional[torch.Tensor] = None
    image_embeds: Optional[torch.Tensor] = None
    mrope_positions: Optional[torch.Tensor] = None  # [3, T] multimodal rope (executor/mrope.py); None: positions

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"
