"""Runner steps for tests that compare two paths of one model: a prefill then decode steps, straight through
ModelRunner.run_step (no scheduler), so each path sees the same batches."""

from __future__ import annotations

import torch

from radixlang_runtime.model.executor.runner import StepInputs


def decode_scenario(runner, prompts: list[list[int]], row0: int, slot0: int, steps: int = 4,
                    shared: int = 0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Prefill `prompts` into table rows row0.. (after `shared` positions that all the rows hold in the same
    slots: cascade groups, when shared >= MIN_SHARED), then `steps` decode steps of all the rows; the logits
    of every step and the K/V the decode steps wrote (layer 0 and the last layer)."""
    B = len(prompts)
    lens = [len(p) for p in prompts]
    rows = list(range(row0, row0 + B))
    slot = slot0
    if shared:
        ids = [(i * 53 + 7) % 40000 + 100 for i in range(shared)]
        runner.run_step(StepInputs("extend", ids, list(range(slot, slot + shared)), [row0], [0], [shared], [],
                                   [shared - 1]))
        for r in rows[1:]:
            runner.kv_pool.req_to_token[r, :shared] = torch.arange(slot, slot + shared)
        slot += shared
    out_loc = list(range(slot, slot + sum(lens)))
    slot += sum(lens)
    ends = [sum(lens[: i + 1]) - 1 for i in range(B)]
    logits = [runner.run_step(StepInputs("extend", sum(prompts, []), out_loc, rows, [shared] * B, lens, [], ends))]
    written = []
    for s in range(steps):
        ids = [int(t) for t in logits[-1].argmax(-1)]
        loc = list(range(slot, slot + B))
        slot += B
        written += loc
        logits.append(runner.run_step(StepInputs("decode", ids, loc, rows, [shared + n + s for n in lens], [1] * B, [],
                                                 list(range(B)))))
    pool = runner.kv_pool
    idx = torch.tensor(written)
    kv = torch.cat([pool.k_buffers[i][:, idx].flatten() for i in (0, -1)] +
                   [pool.v_buffers[i][:, idx].flatten() for i in (0, -1)])
    return logits, kv
