"""DraftModel: the draft model of --speculative-algorithm STANDALONE (docs/SPECULATIVE.md), the model side.

A second ModelRunner (its own weights, e.g. the same .gguf's Q4_1 blocks, and its own KV pool) whose pool
mirrors the target's: the same table rows, the same context, and slots 0 .. target_slots - 1 indexed by the
slot ids the target's allocator hands out. Two operations:

- mirror(step): the draft model runs every StepInputs the target runs (ModelRunner.forward calls it), so
  every slot holding target K/V also holds the draft's K/V of the same token at the same position. The
  target's radix cache then covers the draft too (a cached prefix's slots hold both), freeing a slot frees
  both, and no second allocator or tree exists.
- propose(...): for B requests whose K/V is valid up to prefix_lens[b] (their table rows as the target's,
  plus the rewrites of rows whose slots changed in place since the last step), k greedy draft tokens after
  last_tokens[b]: k batched decode steps. Their K/V goes to scratch slots past the mirrored ones
  (target_slots + row * max_steps + j, one scratch run per table row); the step that verifies the draft is
  mirrored too: the K/V the proposal computed for the tokens it runs (t0 .. d(k-1)) is copied from scratch
  to its slots, and the draft model runs only on the rest (dk: one token a request, a decode step).

Invariant: draft K/V at slot s (< target_slots) is valid wherever target K/V at s is (both written by the
same StepInputs), so the draft's positions 0 .. prefix_len - 1 of a request read what its target read.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import torch

from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


class DraftModel:
    def __init__(self, runner, target_slots: int, max_steps: int):
        self.runner = runner  # ModelRunner of the draft (its own pool: target_slots + scratch)
        self.target_slots = target_slots
        self.max_steps = max_steps
        self.steps = 0  # mirrored steps (stats)
        self.copied = 0  # mirrored positions whose K/V came from the proposal's scratch instead of a forward
        # the last propose(): table row -> (prefix_len, the tokens whose K/V it left in the row's scratch run,
        # scratch j holding position prefix_len + j); consumed by the next mirror
        self._proposed: dict[int, tuple[int, list[int]]] = {}

    @classmethod
    def build(cls, args: ServerArgs, target, draft_dir: str, target_vocab: Optional[dict] = None,
              draft_vocab: Optional[dict] = None) -> "DraftModel":
        """The draft runner for `target` (a ModelRunner with resolved args): same device, dtype, page size,
        table rows and context; pool = the target's slots + one scratch run of max_steps per table row.
        A draft whose vocabulary differs from the target's is refused by name (verification compares ids)."""
        from radixlang_runtime.model.runner import ModelRunner

        steps = args.speculative_standalone_settings()[0]
        sizes = target.sizes
        ps = args.page_size
        scratch = -(-sizes.table_rows * steps // ps) * ps
        dargs = args.replace(
            quantization=args.speculative_draft_model_quantization, max_total_tokens=sizes.num_slots + scratch,
            max_running_requests=sizes.table_rows, context_length=sizes.context_len, dtype=str(target.dtype)[6:],
            speculative_algorithm=None, speculative_num_draft_tokens=None, speculative_num_steps=None,
            speculative_draft_model_path=None, speculative_draft_model_quantization=None,
            speculative_disable_by_batch_size=None,
            # the target's deterministic mode holds whatever the draft proposes (its rows verify any draft alike),
            # so the draft keeps its own fast paths (and a quantized draft, which the mode would refuse)
            enable_deterministic_inference=False)
        runner = ModelRunner(dargs, draft_dir)
        if runner.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"speculative_draft_model_path {args.speculative_draft_model_path!r}: vocab size "
                             f"{runner.cfg.vocab_size} differs from the target's {target.cfg.vocab_size} (the draft "
                             "must share the target's tokenizer)")
        if target_vocab is not None and draft_vocab is not None and target_vocab != draft_vocab:
            raise ValueError(f"speculative_draft_model_path {args.speculative_draft_model_path!r}: its tokenizer's "
                             "vocabulary differs from the target's (the draft must share the target's tokenizer)")
        if runner.sizes.num_slots < sizes.num_slots + sizes.table_rows * steps:
            raise RuntimeError("draft pool smaller than the target's slots + scratch")  # page rounding: a bug
        logger.info("STANDALONE draft %s (%s, quantization %s): %d steps, pool %d slots (%d scratch)", draft_dir,
                    runner.dtype, dargs.quantization, steps, runner.sizes.num_slots, scratch)
        return cls(runner, sizes.num_slots, steps)

    @torch.inference_mode()
    def mirror(self, step) -> None:
        """Run the draft over the target's step (same ids, slots, rows, rewrites): its K/V at the same slots.
        The head runs on one row only (no logits are needed)."""
        self.steps += 1
        proposed, self._proposed = self._proposed, {}
        if proposed:
            step = self._skip_proposed(step, proposed)
        self.runner.run_step(dataclasses.replace(step, logit_rows=[len(step.input_ids) - 1]))

    def _skip_proposed(self, step, proposed: dict[int, tuple[int, list[int]]]):
        """The step verifying a draft runs [t0, d1 .. dk] at prefix p: the proposal already computed the draft's
        K/V of its inputs t0 .. d(k-1) at positions p .. into scratch. Those are copied to the step's slots
        (and the table), and the step runs on what is left (at least each request's last token)."""
        pool = self.runner.kv_pool
        ids, locs, prefix, lens, src, dst = [], [], [], [], [], []
        off = 0
        for row, p, n in zip(step.req_rows, step.prefix_lens, step.extend_lens):
            x, slots = step.input_ids[off:off + n], step.out_loc[off:off + n]
            off += n
            c = 0
            if row in proposed and proposed[row][0] == p:
                covered = proposed[row][1]
                while c < min(len(covered), n - 1) and x[c] == covered[c]:
                    c += 1
            if c:
                src += [self.target_slots + row * self.max_steps + j for j in range(c)]
                dst += slots[:c]
                pool.req_to_token[row, p:p + c] = torch.tensor(slots[:c], dtype=torch.int64)
            ids += x[c:]
            locs += slots[c:]
            prefix.append(p + c)
            lens.append(n - c)
        if not src:
            return step
        self.copied += len(src)
        s, d = (torch.tensor(v, dtype=torch.int64, device=pool.k_buffers[0].device) for v in (src, dst))
        for buf in pool.k_buffers + pool.v_buffers:
            buf.index_copy_(1, d, buf.index_select(1, s))
        phase = "decode" if all(n == 1 for n in lens) else step.phase
        return dataclasses.replace(step, phase=phase, input_ids=ids, out_loc=locs, prefix_lens=prefix,
                                   extend_lens=lens)

    @torch.inference_mode()
    def propose(self, rows: list[int], prefix_lens: list[int], last_tokens: list[int], k: int,
                rewrites: list[tuple[int, list[int]]]) -> list[list[int]]:
        """[B] rows of req_to_token, K/V valid for positions < prefix_lens[b], the token at position
        prefix_lens[b]; k <= max_steps greedy draft tokens each ([B][k])."""
        from radixlang_runtime.model.runner import StepInputs

        B = len(rows)
        if k > self.max_steps:
            raise ValueError(f"propose: k {k} > max_steps {self.max_steps}")
        out: list[list[int]] = [[] for _ in range(B)]
        toks = list(last_tokens)
        for j in range(k):
            locs = [self.target_slots + r * self.max_steps + j for r in rows]
            step = StepInputs("decode", toks, locs, list(rows), [p + j for p in prefix_lens], [1] * B,
                              rewrites if j == 0 else [], list(range(B)))
            logits = self.runner.run_step(step)  # [B, V] float32
            toks = logits.argmax(dim=-1).tolist()
            for b, t in enumerate(toks):
                out[b].append(t)
        self._proposed = {r: (p, [t] + o[:k - 1]) for r, p, t, o in zip(rows, prefix_lens, last_tokens, out)}
        return out
