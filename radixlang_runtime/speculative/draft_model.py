"""DraftModel: the draft model of --speculative-algorithm STANDALONE (docs/SPECULATIVE.md), the model side.

A second ModelRunner (its own weights, e.g. the same .gguf's Q4_1 blocks, and its own KV pool) whose pool
mirrors the target's: the same table rows, the same context, and slots 0 .. target_slots - 1 indexed by the
slot ids the target's allocator hands out. Three operations:

- mirror(step): while drafting is on (set_active(True), the scheduler's choice before each step), the draft
  model runs the target's StepInputs (ModelRunner.forward calls it) for every request whose draft history is
  whole, so those slots hold the draft's K/V of the same token at the same position. The target's radix cache
  then covers the draft too (a cached prefix's slots hold both), freeing a slot frees both, and no second
  allocator or tree exists. While drafting is off (a batch where drafts do not pay) nothing runs: the step's
  slots are only marked invalid, so stepping aside costs the draft nothing.
- propose(...): for B requests, k greedy draft tokens after last_tokens[b]: k batched decode steps. A request
  whose draft history has a gap (steps it was not mirrored in, or a cached prefix computed while drafting was
  off) is first caught up: one batched extend of the draft over its positions from the first invalid one.
  The proposal's K/V goes to scratch slots past the mirrored ones (target_slots + row * max_steps + j, one
  scratch run per table row); the step that verifies the draft is mirrored too: the K/V the proposal computed
  for the tokens it runs (t0 .. d(k-1)) is copied from scratch to its slots, and the draft model runs only on
  the rest (dk: one token a request, a decode step).

Invariants: valid[s] (s < target_slots) is True only where the draft's K/V at slot s was computed over a whole
history, i.e. is what mirroring every step would have left there; row_len[row] positions of a table row
(the draft's req_to_token) point at such slots. The target's output never depends on either: a draft is only
verified, so a stale draft K/V could cost acceptance, never correctness.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Callable, Optional

import torch

from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


class DraftModel:
    reads_hidden = False  # the target's hidden states: not read (ModelRunner.forward)

    def __init__(self, runner, target_slots: int, max_steps: int):
        self.runner = runner  # ModelRunner of the draft (its own pool: target_slots + scratch)
        self.target_slots = target_slots
        self.max_steps = max_steps
        self.steps = 0  # mirrored steps (stats)
        self.copied = 0  # mirrored positions whose K/V came from the proposal's scratch instead of a forward
        # the last propose(): table row -> (prefix_len, the tokens whose K/V it left in the row's scratch run,
        # scratch j holding position prefix_len + j); consumed by the next mirror
        self._proposed: dict[int, tuple[int, list[int]]] = {}
        self.active = True  # mirror the next steps (set_active: the scheduler drafts, or steps aside)
        self.valid = torch.zeros(target_slots, dtype=torch.bool)  # slot s holds whole-history draft K/V
        self.row_len = [0] * runner.sizes.table_rows  # leading positions of a table row with valid draft K/V
        self.skipped = 0  # target steps not mirrored (drafting off) (stats)
        self.caught_up = 0  # positions the draft recomputed before a proposal (stats)

    @classmethod
    def build(cls, args: ServerArgs, target, draft_dir: str, target_vocab: Optional[dict] = None,
              draft_vocab: Optional[dict] = None) -> "DraftModel":
        """The draft runner for `target` (a ModelRunner with resolved args): same device, dtype, page size,
        table rows and context; pool = the target's slots + one scratch run of max_steps per table row.
        A draft whose vocabulary differs from the target's is refused by name (verification compares ids)."""
        from radixlang_runtime.model.executor.runner import ModelRunner

        steps = args.speculative_chain_settings()[0]
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
            enable_deterministic_inference=False,
            # the draft runs run_step (its proposals, the mirrored steps), never the graph path's decode
            disable_cuda_graph=True, cuda_graph_emulate=False, cuda_graph_bs=None, cuda_graph_max_bs=None)
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

    def stats(self) -> dict:
        return {"mirrored_steps": self.steps, "skipped_steps": self.skipped, "caught_up_tokens": self.caught_up,
                "copied_tokens": self.copied}

    def set_active(self, on: bool) -> None:
        """Whether the next target steps are mirrored (the scheduler: drafting on / stepped aside)."""
        self.active = on

    def _first_invalid(self, slots: list[int]) -> int:
        """How many leading slots of `slots` hold valid draft K/V."""
        if not slots:
            return 0
        bad = torch.nonzero(~self.valid[torch.tensor(slots, dtype=torch.int64)])
        return int(bad[0, 0]) if bad.numel() else len(slots)

    def _mark(self, slots: list[int], valid: bool) -> None:
        if slots:
            self.valid[torch.tensor(slots, dtype=torch.int64)] = valid

    def _note_rewrites(self, rewrites: list[tuple[int, list[int]]]) -> None:
        """A rewritten table row is valid as far as its new slots are."""
        for row, slots in rewrites:
            self.row_len[row] = self._first_invalid(slots)

    @torch.inference_mode()
    def mirror(self, step, hidden=None, result=None, sampled=None) -> None:
        """Run the draft over the target's step (same ids, slots, rows, rewrites) for the requests whose draft
        history is whole: its K/V at the same slots. The rest (all of them while drafting is off) are only
        marked: their slots invalid, their rows cut back to the step's prefix. The head runs on one row only."""
        proposed, self._proposed = self._proposed, {}
        self._note_rewrites(step.rewrites)
        ends = list(itertools.accumulate(step.extend_lens))
        kept, dropped = [], []  # request indices
        for i, (row, p, n) in enumerate(zip(step.req_rows, step.prefix_lens, step.extend_lens)):
            if self.active and (p == 0 or self.row_len[row] >= p):
                kept.append(i)
                self.row_len[row] = p + n
            else:
                dropped.append(i)
                self.row_len[row] = min(self.row_len[row], p)
        self._mark([s for i in dropped for s in step.out_loc[ends[i] - step.extend_lens[i]:ends[i]]], False)
        if not kept:
            self.skipped += 1
            return
        self.steps += 1
        sub = step
        if dropped:  # the kept requests' part of the step
            spans = [(ends[i] - step.extend_lens[i], ends[i]) for i in kept]
            rows = {step.req_rows[i] for i in kept}
            sub = dataclasses.replace(
                step, input_ids=[t for a, b in spans for t in step.input_ids[a:b]],
                out_loc=[s for a, b in spans for s in step.out_loc[a:b]],
                req_rows=[step.req_rows[i] for i in kept], prefix_lens=[step.prefix_lens[i] for i in kept],
                extend_lens=[step.extend_lens[i] for i in kept],
                rewrites=[rw for rw in step.rewrites if rw[0] in rows])
        locs = sub.out_loc
        if proposed:
            sub = self._skip_proposed(sub, proposed)
        self.runner.run_step(dataclasses.replace(sub, logit_rows=[len(sub.input_ids) - 1]))
        self._mark(locs, True)

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
                rewrites: list[tuple[int, list[int]]], kv_slots: list[list[int]],
                history: Callable[[int], list[int]]) -> tuple[list[list[int]], float]:
        """[B] rows of req_to_token whose target K/V covers positions < prefix_lens[b] at kv_slots[b], the token
        at position prefix_lens[b]; history(b): request b's tokens (at least its first prefix_lens[b]). Requests
        with a gap in their draft K/V are caught up first. Returns k <= max_steps greedy draft tokens each
        ([B][k]) and the seconds the catching up took (the mirror's deferred work, not the proposal's)."""
        from radixlang_runtime.model.executor.runner import StepInputs

        B = len(rows)
        if k > self.max_steps:
            raise ValueError(f"propose: k {k} > max_steps {self.max_steps}")
        self._note_rewrites(rewrites)
        began = time.perf_counter()
        self._catch_up([b for b in range(B) if self.row_len[rows[b]] < prefix_lens[b]], rows, prefix_lens,
                       kv_slots, history)
        caught = time.perf_counter() - began
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
        return out, caught

    def _catch_up(self, need: list[int], rows: list[int], prefix_lens: list[int], kv_slots: list[list[int]],
                  history: Callable[[int], list[int]]) -> None:
        """One batched extend of the draft over each listed request's positions from its first invalid one
        (p0 = the row's valid length, never past a slot marked invalid) to prefix_lens[b]: afterwards its row
        and slots are whole again."""
        from radixlang_runtime.model.executor.runner import StepInputs

        ids, locs, crow, cpre, clen, rw = [], [], [], [], [], []
        for b in need:
            row, p = rows[b], prefix_lens[b]
            slots = kv_slots[b][:p]
            p0 = min(self.row_len[row], self._first_invalid(slots))
            ids += history(b)[p0:p]
            locs += slots[p0:]
            crow.append(row)
            cpre.append(p0)
            clen.append(p - p0)
            if p0:
                rw.append((row, slots[:p0]))
        if not need:
            return
        self.runner.run_step(StepInputs("extend", ids, locs, crow, cpre, clen, rw, [len(ids) - 1]))
        self._mark(locs, True)
        for b in need:
            self.row_len[rows[b]] = prefix_lens[b]
        self.caught_up += len(ids)
