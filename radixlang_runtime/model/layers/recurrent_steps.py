"""How a recurrent layer (Gated DeltaNet, Mamba2) walks one step's requests over the state pool, whatever its
math: the layer brings its rule (the decode step over some rows and their slots) and its extend (one request's
new tokens from its slot); this file owns where states are saved and how a verify step keeps them.

- extend: each request's tokens from its slot's state (zeros when fresh), written back; a planned snapshot
  (ForwardBatch.state_saves: offset, snapshot slot) inside the request's tokens splits them in two pieces with
  the state copied between; verifying requests run last, position by position with the decode rule, the state
  after each kept in the step's scratch (mem/verify_states.py) for the rollback;
- decode: the layer's rule over the batch, then the rows ending on a page boundary save their state.
"""

from __future__ import annotations

from typing import Callable

import torch

from radixlang_runtime.model.executor.forward_batch import ForwardBatch

# (rows of the step's tokens, their state slots [n]) -> output [n, ...]: one token of each row, states in place
Rule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (one request's rows, its slot, whether its state starts from zeros) -> output [L, ...]: its state written back
Extend = Callable[[slice, int, bool], torch.Tensor]


def save_state(ssm: torch.Tensor, conv: torch.Tensor, slot: int, snapshot: int) -> None:
    """One layer's state at `slot` copied into snapshot slot `snapshot`."""
    ssm[snapshot] = ssm[slot]
    conv[snapshot] = conv[slot]


def decode_saves(fb: ForwardBatch, ssm: torch.Tensor, conv: torch.Tensor) -> None:
    """After a decode step: the rows the scheduler marked (ending on a page boundary) save their state."""
    for i, (_, snapshot) in fb.state_saves.items():
        save_state(ssm, conv, fb.state_slots_cpu[i], snapshot)


def extend_requests(fb: ForwardBatch, extend: Extend, rule: Rule, state_index: int, ssm: torch.Tensor,
                    conv: torch.Tensor) -> torch.Tensor:
    """An extend step's output for all its rows, in order (the module docstring's walk)."""
    outs: list = []
    spans: list[tuple[int, int, int]] = []
    start = 0
    for i, (slot, n, fresh) in enumerate(zip(fb.state_slots_cpu, fb.extend_lens_cpu, fb.state_fresh)):
        save = fb.state_saves.get(i)
        if fb.state_verify is not None and i in fb.state_verify.first:  # after the others, batched
            spans.append((i, start, n))
            outs.append(i)
        elif save is None or save[0] == n:
            outs.append(extend(slice(start, start + n), slot, fresh))
            if save is not None:
                save_state(ssm, conv, slot, save[1])
        else:  # the state after the first `off` tokens is saved: two pieces
            off = save[0]
            outs.append(extend(slice(start, start + off), slot, fresh))
            save_state(ssm, conv, slot, save[1])
            outs.append(extend(slice(start + off, start + n), slot, False))
        start += n
    if spans:
        verified = verify_positions(fb, spans, rule, state_index, ssm, conv)
        outs = [verified[x] if isinstance(x, int) else x for x in outs]
    return torch.cat(outs)


def verify_positions(fb: ForwardBatch, spans: list[tuple[int, int, int]], rule: Rule, state_index: int,
                     ssm: torch.Tensor, conv: torch.Tensor) -> dict[int, torch.Tensor]:
    """Verifying requests (request index, first row, k + 1 rows): their tokens position by position with the
    decode rule, the rows of one position batched, the state after each kept in fb.state_verify and a planned
    save taken where its offset is reached. -> request index: output [k + 1, ...]."""
    verify, outs = fb.state_verify, {i: [] for i, _, _ in spans}
    for j in range(max(n for _, _, n in spans)):
        live = [(i, start) for i, start, n in spans if n > j]
        rows = torch.tensor([start + j for _, start in live], dtype=torch.int64, device=fb.state_slots.device)
        slots = fb.state_slots[[i for i, _ in live]]
        o = rule(rows, slots)
        verify.put(state_index, [verify.first[i] + j for i, _ in live], ssm[slots], conv[slots])
        for k, (i, _) in enumerate(live):
            outs[i].append(o[k])
            save = fb.state_saves.get(i)
            if save is not None and save[0] == j + 1:
                save_state(ssm, conv, fb.state_slots_cpu[i], save[1])
    return {i: torch.stack(o) for i, o in outs.items()}
