"""NextNDraft: the draft of --speculative-algorithm NEXTN (SGLang's EAGLE / NEXTN on DeepSeek V3, GLM-4.5, Qwen3-Next
and Qwen3.5; vLLM's MTP),
the model side: the checkpoint's multi-token-prediction layer (model/models/nextn.py) as a second ModelRunner with
its own one-layer KV pool, proposing through ModelDrafter like STANDALONE's draft model (docs/SPECULATIVE.md).

The layer at position i reads the target's final hidden state h_i and the token at i + 1, so it runs behind the
target, after sampling (ModelRunner.forward calls `mirror` with every row's hidden state and the step's result):
- each request's positions whose next token the step settled (a prefill's positions but its last, which waits for
  its sampled token; a verify step's kept positions, each followed by its accepted draft token or the new token)
  run as one batched extend, at the target's slots, so the target's radix cache covers the layer's K/V too (a
  prefix's slots hold both) and freeing a slot frees both;
- a chunk that samples nothing leaves its last position pending (row -> its hidden state) until the next chunk
  brings the token after it;
- the last position of a request that sampled is the one whose output predicts the token after the new one: the
  layer's final hidden state there is kept for `propose`, whose head gives the first draft token (a step where
  drafting is stepped aside runs no head).
propose() takes that first token and chains num_steps - 1 more decode steps of the same layer, each reading the
previous step's hidden state (SGLang's and vLLM's chain), their K/V in scratch slots past the target's
(target_slots + row * (max_steps - 1) + j); the verify step's mirror then recomputes those positions from the
target's own hidden states.

The layer mirrors every step, drafting or not (one layer: cheap beside the target), so its K/V has no gaps to
catch up. A cached prefix's last position holds the layer's K/V of whatever token followed it when it was
computed; like a stale draft K/V anywhere, that can cost acceptance, never correctness (a draft is only verified).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from radixlang_runtime.model.executor.runner import ModelRunner, StepInputs
from radixlang_runtime.model.loader.config import ModelConfig
from radixlang_runtime.model.models.nextn import NEXTN_ARCHS
from radixlang_runtime.server_args import ServerArgs

logger = logging.getLogger(__name__)


def nextn_config(model_dir: str) -> ModelConfig:
    """The prediction layer's ModelConfig from the target's config.json; ValueError where the architecture has none
    here or the checkpoint carries none (num_nextn_predict_layers 0)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    arch = (raw.get("architectures") or ["LlamaForCausalLM"])[0]
    if arch not in NEXTN_ARCHS:
        raise ValueError(f"speculative_algorithm NEXTN: {arch} has no multi-token-prediction layer served here "
                         f"(served: {', '.join(NEXTN_ARCHS)})")
    return ModelConfig.from_dict({**raw, "architectures": [NEXTN_ARCHS[arch]]})


class NextNRunner(ModelRunner):
    """A ModelRunner of the prediction layer alone (nextn_config), over the target's checkpoint directory."""

    def _read_config(self):
        tensors = super()._read_config()
        if self.cfg.quant is not None:
            raise ValueError(f"speculative_algorithm NEXTN on a pre-quantized checkpoint ({self.cfg.quant.describe()}) "
                             "is not implemented")
        self.cfg = nextn_config(self.model_dir)
        return tensors


def share_decoder_weights(runner: ModelRunner, target: ModelRunner) -> list[str]:
    """The layer's embedding and head replaced by the decoder's modules where its checkpoint holds the same values
    (the hub checkpoints' copies are; model/models/nextn.py) and both run them alike (float weights, one dtype):
    one copy of each in memory. Returns what was shared."""
    d, t = runner.model, target.model
    if target.args.quantization is not None or target.cfg.quant is not None or runner.dtype != target.dtype:
        return []
    shared = []
    if d.same_embedding and type(d.embed_tokens) is type(t.embed_tokens):
        d.embed_tokens = t.embed_tokens
        shared.append("embedding")
    if d.same_head and type(d.head) is type(t.head) and type(d.lm_head) is type(t.lm_head):
        d.head, d.lm_head = t.head, t.lm_head
        shared.append("head")
    return shared


@dataclass
class _Head:
    """A row's next proposal, left by the mirror of its last step."""

    prefix: int  # the position of the request's newest token (its kv_len when it drafts)
    token: int  # that token
    hidden: torch.Tensor  # [hidden] the layer's final hidden state at prefix - 1: the head gives the token after it


class NextNDraft:
    reads_hidden = True  # ModelRunner.forward hands mirror every row's final hidden state

    def __init__(self, runner: ModelRunner, target: ModelRunner, max_steps: int):
        self.runner = runner
        self.target = target
        self.target_slots = target.sizes.num_slots
        self.max_steps = max_steps
        self.pending: dict[int, tuple[int, torch.Tensor]] = {}  # row -> (position, target hidden) awaiting its token
        self.heads: dict[int, _Head] = {}  # row -> its next proposal's first token
        self.steps = 0  # mirrored steps (stats)
        self.positions = 0  # positions the layer ran behind the target (stats)
        self.proposals = 0  # propose() calls (stats)

    @classmethod
    def build(cls, args: ServerArgs, target: ModelRunner, model_dir: str) -> "NextNDraft":
        """The prediction layer's runner beside `target`: same device, dtype, page size, table rows and context;
        pool = the target's slots + a scratch run of num_steps - 1 per table row."""
        steps = args.speculative_chain_settings()[0]
        sizes, ps = target.sizes, args.page_size
        scratch = -(-sizes.table_rows * (steps - 1) // ps) * ps
        dargs = args.replace(
            quantization=None, max_total_tokens=sizes.num_slots + scratch, max_running_requests=sizes.table_rows,
            context_length=sizes.context_len, dtype=str(target.dtype)[6:], speculative_algorithm=None,
            speculative_num_draft_tokens=None, speculative_num_steps=None, speculative_eagle_topk=None,
            speculative_disable_by_batch_size=None, enable_deterministic_inference=False, disable_cuda_graph=True,
            cuda_graph_emulate=False, cuda_graph_bs=None, cuda_graph_max_bs=None)
        runner = NextNRunner(dargs, model_dir)
        if runner.sizes.num_slots < sizes.num_slots + scratch:
            raise RuntimeError("prediction layer pool smaller than the target's slots + scratch")  # rounding: a bug
        shared = share_decoder_weights(runner, target)
        logger.info("NEXTN draft: %s's multi-token-prediction layer (%s*), %d steps, pool %d slots (%d scratch); "
                    "the decoder's own %s", runner.cfg.architecture, runner.cfg.family_options.layer, steps,
                    runner.sizes.num_slots, scratch, " and ".join(shared) or "nothing")
        return cls(runner, target, steps)

    def _run(self, step: StepInputs, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.runner.model
        model.hidden_in = hidden
        try:
            return self.runner.run_step(step, with_hidden=True)
        finally:
            model.hidden_in = None

    @torch.inference_mode()
    def mirror(self, step: StepInputs, hidden: Optional[torch.Tensor], result, sampled: list[int]) -> None:
        """After the target's step (its extend form; hidden [T, hidden]: every row's final hidden state; result:
        the sampled tokens of the requests `sampled`, and their accepted draft tokens): the layer over the
        positions whose next token is now known (module docstring)."""
        if hidden is None:
            raise RuntimeError("NEXTN: the target's step returned no hidden states")
        tokens = dict(zip(sampled, result.next_token_ids))
        table = self.target.kv_pool.req_to_token
        ids, locs, rows, prefix, lens, rewrites, parts, heads = [], [], [], [], [], [], [], []
        start = 0
        dirty = {row for row, _ in step.rewrites}
        for i, (row, p, n) in enumerate(zip(step.req_rows, step.prefix_lens, step.extend_lens)):
            x, slots = step.input_ids[start:start + n], step.out_loc[start:start + n]
            if i in tokens:  # the kept positions (a verify step's: its token and the accepted draft tokens), each
                keep = result.accepted[i] + 1 if i in result.accepted else n  # followed by the next, the last by
                run, nxt = x[1:keep] + [tokens[i]], None  # the new token
            else:  # no sample: the last position waits for the next chunk's first token
                keep = n - 1
                run, nxt = x[1:], (p + n - 1, hidden[start + n - 1].clone())  # not a view of the whole step
            first, h = p, [hidden[start:start + keep]]
            waiting = self.pending.pop(row, None)
            if waiting is not None and waiting[0] == p - 1:
                first, run, h = p - 1, [x[0]] + run, [waiting[1][None]] + h
                slots = [int(table[row, p - 1])] + slots
            if nxt is not None:
                self.pending[row] = nxt
            start += n
            if not run:
                continue
            ids += run
            locs += slots[:len(run)]
            rows.append(row)
            prefix.append(first)
            lens.append(len(run))
            parts += h
            if row in dirty:
                rewrites.append((row, table[row, :first].tolist()))
            if i in tokens:
                heads.append((row, first + len(run), tokens[i], len(ids) - 1))
        if not ids:
            return
        phase = "decode" if all(n == 1 for n in lens) else "extend"
        out_rows = [r for _, _, _, r in heads]
        _, out = self._run(StepInputs(phase, ids, locs, rows, prefix, lens, rewrites, [], out_rows), torch.cat(parts))
        for (row, pos, tok, _), h in zip(heads, out if out_rows else []):
            self.heads[row] = _Head(pos, tok, h)
        self.steps += 1
        self.positions += len(ids)

    @torch.inference_mode()
    def propose(self, rows: list[int], prefix_lens: list[int], last_tokens: list[int], k: int,
                rewrites: list[tuple[int, list[int]]], kv_slots: list[list[int]],
                history: Callable[[int], list[int]]) -> tuple[list[list[int]], float]:
        """ModelDrafter's ProposeFn: up to k draft tokens for each request whose row's mirror left its proposal
        (a request without one, e.g. a row reused since, drafts nothing this step); nothing to catch up (0 s)."""
        if k > self.max_steps:
            raise ValueError(f"propose: k {k} > max_steps {self.max_steps}")
        self.proposals += 1
        out: list[list[int]] = [[] for _ in rows]
        live = [b for b, (row, p, t) in enumerate(zip(rows, prefix_lens, last_tokens))
                if (head := self.heads.get(row)) is not None and head.prefix == p and head.token == t]
        if not live:
            return out, 0.0
        hid = torch.stack([self.heads[rows[b]].hidden for b in live])
        for b, d in zip(live, self.runner.model.head_logits(hid.to(self.runner.dtype)).argmax(dim=-1).tolist()):
            out[b].append(d)
        for j in range(1, k):
            locs = [self.target_slots + rows[b] * (self.max_steps - 1) + j - 1 for b in live]
            step = StepInputs("decode", [out[b][-1] for b in live], locs, [rows[b] for b in live],
                              [prefix_lens[b] + j - 1 for b in live], [1] * len(live),
                              [rw for rw in rewrites if rw[0] in {rows[b] for b in live}] if j == 1 else [],
                              list(range(len(live))), list(range(len(live))))
            logits, hid = self._run(step, hid)
            for b, d in zip(live, logits.argmax(dim=-1).tolist()):
                out[b].append(d)
        return out, 0.0

    def stats(self) -> dict:
        return {"mirrored_steps": self.steps, "mirrored_positions": self.positions, "proposals": self.proposals}
