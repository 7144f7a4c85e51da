"""Batched sampling over the requests of one step.

All vocabulary work is torch ops over [B, V]; Python loops only run over requests (building the
per-row parameter tensors) and, for the rows with infill, over their top_k candidates. Order: suppress EOS/stop
ids before min_new_tokens -> the token masks (allowed_token_ids: every other token -inf; bad_words: a word's last
token -inf where the output ends with the rest of it), before penalties and bias as in vLLM -> penalties ->
logit_bias (added to the penalized logits, so +100 / -100 force / ban a token whatever the penalties did; a token
the grammar mask, min_new_tokens or a token mask set to -inf stays -inf) -> greedy rows take argmax -> the rest:
temperature, softmax, top-k / top-p / min-p on the sorted distribution, llama.cpp's infill stage on the rows that
ask for it (infill_sampling.py), then an exponential-race draw (argmax p / E, E ~ Exp(1)), which is a sample from
p -> a forced row (SampleSpec.forced) takes its token whatever was drawn. A seeded request draws its noise from a
generator keyed by (seed, step), so its tokens do not depend on what else is in the batch. The stop-id
suppression, the masks and logit_bias are one mechanism: a scatter of (row, token) pairs over the batch
(_scatter).
"""
from __future__ import annotations

from typing import Sequence, Union

import torch

from radixlang_runtime.model.executor.infill_sampling import InfillStage
from radixlang_runtime.model.executor.step_io import SampleSpec


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int], device: torch.device, seed: int):
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.infill = InfillStage()  # the runner's owner gives it the tokenizer's pieces (wiring.py)

    def sample(self, logits: torch.Tensor, reqs: list[SampleSpec]) -> list[int]:
        """logits [B, V] float32 (modified in place) -> one token id per request."""
        self._suppress_stop_tokens(logits, reqs)
        self._apply_allowed_tokens(logits, reqs)
        self._apply_bad_words(logits, reqs)
        pen_rows = [i for i, r in enumerate(reqs) if r.sampling.has_penalties]
        if pen_rows:
            self._apply_penalties(logits, [reqs[i] for i in pen_rows], pen_rows)
        self._apply_logit_bias(logits, reqs)
        greedy = [r.sampling.is_greedy for r in reqs]
        if all(greedy):
            return self._force(logits.argmax(dim=-1).tolist(), reqs)
        out = logits.argmax(dim=-1)
        rows = [i for i, g in enumerate(greedy) if not g]
        out[rows] = self._sample_rows(logits[rows], [reqs[i] for i in rows])
        return self._force(out.tolist(), reqs)

    @staticmethod
    def _force(tokens: list[int], reqs: list[SampleSpec]) -> list[int]:
        """A row whose token is decided (SampleSpec.forced: a spent thinking budget) takes it."""
        for i, r in enumerate(reqs):
            if r.forced is not None:
                tokens[i] = r.forced
        return tokens

    # ------------------------------------------------------------------ logits processing
    @staticmethod
    def _scatter(t: torch.Tensor, rows: list[int], cols: list[int], vals: Union[list[float], float, bool],
                 accumulate: bool = False) -> None:
        """t[rows[k], cols[k]] = vals[k] (+= with accumulate; one value: every pair): one index_put_ over the
        batch. Token ids are checked against the vocabulary on intake (SamplingParams.check_vocab)."""
        if rows:
            dev = t.device
            t.index_put_((torch.tensor(rows, device=dev), torch.tensor(cols, device=dev)),
                         torch.tensor(vals, dtype=t.dtype, device=dev), accumulate=accumulate)

    def _suppress_stop_tokens(self, logits: torch.Tensor, reqs: list[SampleSpec]) -> None:
        rows, cols = [], []
        for i, r in enumerate(reqs):
            sp = r.sampling
            if len(r.output_ids) < sp.min_new_tokens:
                # every end token, ignore_eos or not (SGLang's min-new-tokens penalizer does the same)
                ids = set(sp.stop_token_ids) | set(self.eos_token_ids)
                rows.extend([i] * len(ids))
                cols.extend(ids)
        self._scatter(logits, rows, cols, float("-inf"))

    @classmethod
    def _apply_logit_bias(cls, logits: torch.Tensor, reqs: list[SampleSpec]) -> None:
        """logits[i, t] += reqs[i].sampling.logit_bias[t]."""
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        for i, r in enumerate(reqs):
            bias = r.sampling.logit_bias
            if bias:
                rows.extend([i] * len(bias))
                cols.extend(bias.keys())
                vals.extend(bias.values())
        cls._scatter(logits, rows, cols, vals, accumulate=True)

    @classmethod
    def _apply_allowed_tokens(cls, logits: torch.Tensor, reqs: list[SampleSpec]) -> None:
        """Rows with allowed_token_ids: every other token -inf (a keep mask scattered over those rows)."""
        rows = [i for i, r in enumerate(reqs) if r.sampling.allowed_token_ids is not None]
        if not rows:
            return
        keep_rows: list[int] = []
        keep_cols: list[int] = []
        for j, i in enumerate(rows):
            ids = reqs[i].sampling.allowed_token_ids
            keep_rows.extend([j] * len(ids))
            keep_cols.extend(ids)
        keep = torch.zeros(len(rows), logits.shape[1], dtype=torch.bool, device=logits.device)
        cls._scatter(keep, keep_rows, keep_cols, True)
        idx = torch.tensor(rows, device=logits.device)
        logits[idx] = logits[idx].masked_fill(~keep, float("-inf"))

    @classmethod
    def _apply_bad_words(cls, logits: torch.Tensor, reqs: list[SampleSpec]) -> None:
        """bad_words (as vLLM's apply_bad_words): a word's last token -inf when the output so far ends with
        the word's other tokens (a one-token word: always)."""
        rows: list[int] = []
        cols: list[int] = []
        for i, r in enumerate(reqs):
            out = r.output_ids
            for word in r.sampling.bad_words_ids or ():
                k = len(word) - 1
                if k <= len(out) and (k == 0 or out[-k:] == word[:-1]):
                    rows.append(i)
                    cols.append(word[-1])
        cls._scatter(logits, rows, cols, float("-inf"))

    def _apply_penalties(self, logits: torch.Tensor, reqs: list[SampleSpec], rows: list[int]) -> None:
        V, dev = self.vocab_size, logits.device
        b = len(reqs)

        def padded(seqs: list[list[int]]) -> torch.Tensor:  # [b, L] ids, V = padding (and an image's pad ids)
            L = max(1, max(len(s) for s in seqs))
            t = torch.full((b, L), V, dtype=torch.int64)
            for j, s in enumerate(seqs):
                if s:
                    t[j, : len(s)] = torch.tensor(s, dtype=torch.int64).clamp_(max=V)
            return t.to(dev)

        sub = logits[rows]  # [b, V]
        out_ids = padded([r.output_ids for r in reqs])
        counts = torch.zeros(b, V + 1, dtype=torch.float32, device=dev)
        counts.scatter_add_(1, out_ids, torch.ones_like(out_ids, dtype=torch.float32))
        counts = counts[:, :V]  # [b, V] occurrences in the output so far
        freq = torch.tensor([r.sampling.frequency_penalty for r in reqs], device=dev)[:, None]
        pres = torch.tensor([r.sampling.presence_penalty for r in reqs], device=dev)[:, None]
        sub -= freq * counts + pres * (counts > 0).float()
        rep = torch.tensor([r.sampling.repetition_penalty for r in reqs], device=dev)[:, None]
        if (rep != 1.0).any():
            seen = torch.zeros(b, V + 1, dtype=torch.bool, device=dev)
            seen.scatter_(1, padded([r.input_ids + r.output_ids for r in reqs]), True)
            seen = seen[:, :V]  # tokens of prompt or output: the repetition penalty's scope (as HF)
            sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
        logits[rows] = sub

    # ------------------------------------------------------------------ drawing
    def _sample_rows(self, logits: torch.Tensor, reqs: list[SampleSpec]) -> torch.Tensor:
        """logits [b, V] of non-greedy rows -> token ids [b]."""
        dev = logits.device
        temp = torch.tensor([r.sampling.temperature for r in reqs], device=dev)[:, None]
        probs = torch.softmax(logits / temp, dim=-1)  # [b, V]
        top_k = [r.sampling.top_k for r in reqs]
        top_p = [r.sampling.top_p for r in reqs]
        min_p = [r.sampling.min_p for r in reqs]
        needs_sort = any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p) or any(m > 0 for m in min_p)
        if needs_sort:
            probs, order = probs.sort(dim=-1, descending=True)  # [b, V]
            ranks = torch.arange(probs.shape[1], device=dev)[None, :]
            k = torch.tensor([k if k > 0 else probs.shape[1] for k in top_k], device=dev)[:, None]
            drop = ranks >= k
            p = torch.tensor(top_p, device=dev)[:, None]
            drop |= (probs.cumsum(dim=-1) - probs) > p  # keep the smallest prefix with mass >= top_p
            m = torch.tensor(min_p, device=dev)[:, None]
            drop |= probs < m * probs[:, :1]
            drop[:, 0] = False  # the most likely token always survives
            probs = probs.masked_fill(drop, 0.0)
        ends = self._apply_infill(probs, order, reqs) if needs_sort else {}
        noise = self._exponential_noise(reqs, probs.shape[1], dev)
        choice = (probs / noise).argmax(dim=-1)  # [b]
        if needs_sort:
            choice = order.gather(1, choice[:, None]).squeeze(1)
        for j, token in ends.items():
            choice[j] = token
        return choice

    def _apply_infill(self, probs: torch.Tensor, order: torch.Tensor, reqs: list[SampleSpec]) -> dict[int, int]:
        """llama.cpp's infill stage on the rows with SamplingParams.infill (their top_k >= 1: sorted here) ->
        {row: end token} for the rows it ends. A row still short of min_new_tokens skips it (it could end)."""
        rows = [j for j, r in enumerate(reqs) if r.sampling.infill and r.sampling.top_k > 0
                and len(r.output_ids) >= r.sampling.min_new_tokens]
        if not rows:
            return {}
        ends = [set(self.eos_token_ids) | set(r.sampling.stop_token_ids) for r in reqs]
        end_token = self.eos_token_ids[0] if self.eos_token_ids else min(ends[rows[0]], default=0)
        return self.infill.apply(probs, order, rows, [r.sampling.top_k for r in reqs], ends, end_token)

    def _exponential_noise(self, reqs: list[SampleSpec], V: int, dev: torch.device) -> torch.Tensor:
        noise = torch.empty(len(reqs), V, device=dev).exponential_(generator=self.generator)
        for j, r in enumerate(reqs):
            seed = r.sampling.sampling_seed
            if seed is not None:
                g = torch.Generator(device=dev).manual_seed((seed * 1_000_003 + len(r.output_ids)) % (2**63))
                noise[j].exponential_(generator=g)
        return noise
