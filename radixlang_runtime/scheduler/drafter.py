"""Draft sources for the draft-verify path (torch-free): what a request proposes for the next forward
pass to verify (model/sample_step.py accepts draft[j] while the token sampled at row j equals it).

Two sources, one interface (`draft(req) -> list[int]`, at most k tokens):
- the grammar's jump-forward (GrammarQueue.draft): constrained requests, forced tokens + the grammar
  states of the verification rows' masks (unchanged; it owns req.draft_states);
- NgramDrafter (--speculative-algorithm NGRAM): prompt lookup for unconstrained requests. In this first
  version constrained requests never get an n-gram draft (their grammar's forced tokens are the draft).
  Where the request's own text has no match, the radix tree is the corpus: the tokens a cached request
  said after the same text (RadixCache.continuation, a read-only walk; nothing held between steps).

Exactness: a deterministic draft is a point mass; accepting draft[j] iff the token sampled at row j equals
it keeps every token's distribution (greedy: the same tokens). The rows see the output as it was before
the step for penalties, min_new_tokens' EOS mask and a seeded request's noise, so such requests are not
drafted for (`_draftable`): their tokens then match token-by-token decoding exactly too.

Invariants of a draft: len <= k; never past max_new_tokens (room for the model's own token) or the
context; never a finish id (EOS unless ignore_eos, stop_token_ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.scheduler.request import Req


@dataclass
class NgramConfig:
    num_draft_tokens: int  # k: most tokens one draft proposes
    min_match: int  # shortest suffix looked up (n from max_match down to min_match)
    max_match: int
    disable_batch_size: int = 0  # no n-gram drafts while the decode batch has more requests (0: no limit)
    row_cost: float = 0.0  # prior b / a of a step's cost a + b * rows (ROW_COST); 0: rows free, never trimmed


# A decode step of M rows (requests + draft rows, one C call per layer) costs about a + b * M: on this project's
# CPU (SmolLM2-135M bf16, one thread, context 256) a = 13 ms, b = 1.75 ms, so b / a = 0.13; the ratio is
# roughly a machine constant (both terms scale with the weights: streaming them vs multiplying by them).
# Measured by `benchmarks/bench_spec.py --step-cost` (docs/PERFORMANCE.md#ngram-speculation). Only the prior:
# the slope around a given batch size differs (~0.25 around batch 4 on the same CPU), so the rule uses the ratio
# measured online per batch size regime (scheduler/spec_cost.StepCost, Drafts.gate), seeded with this.
ROW_COST = 0.13
DECAY = 0.8  # weight of the past in a request's acceptance estimate (spec_hits / spec_trials)


def acceptance(req: Req) -> float:
    """P(the model agrees with the request's next draft token), from its recent verifications (a Beta(1, 1)
    prior: 0.5 before any). Draft position j (1-based) is then accepted with probability acceptance ** j."""
    return (req.spec_hits + 1.0) / (req.spec_trials + 2.0)


def trim_to_cost(reqs: list[Req], row_cost: float) -> None:
    """Before a step over `reqs`: cut each n-gram draft to the rows that pay for themselves. A step of M rows
    costs 1 + row_cost * M (units of the fixed part) and yields T expected tokens (one per request, plus
    the expected accepted draft tokens); a draft row of value v (its acceptance probability) is kept when
    (T + v) / (1 + c (M + 1)) > T / (1 + c M), i.e. v (1 + c M) > c T. Rows are taken best first, so each
    request keeps a prefix of its draft (values fall along it). Small batches keep most rows (a row is
    nearly free while the weights' streaming dominates), large ones only drafts the model nearly always
    takes: throughput never drops by the model's estimate. Jump-forward drafts (constrained) count as
    rows worth one token each and are never cut. A request whose whole draft is cut has its estimate decayed
    toward the prior (0.5), so one bad draft does not stop it drafting for good at a mid-size batch."""
    if row_cost <= 0:
        return
    tokens = rows = float(len(reqs))
    cands = []
    for i, r in enumerate(reqs):
        if r.grammar is not None:
            tokens += len(r.draft)
            rows += len(r.draft)
        elif r.draft:
            a = acceptance(r)
            cands += [(a ** (j + 1), i) for j in range(len(r.draft))]
    keep = [0] * len(reqs)
    for v, i in sorted(cands, reverse=True):
        if v * (1.0 + row_cost * rows) <= row_cost * tokens:
            break
        keep[i] += 1
        tokens += v
        rows += 1
    for i, r in enumerate(reqs):
        if r.grammar is None and r.draft:
            r.draft = r.draft[:keep[i]]
            if not r.draft:  # not verified, so never re-estimated: the estimate drifts back to the prior instead
                r.spec_hits *= DECAY
                r.spec_trials *= DECAY


@dataclass
class NgramIndex:
    """Per request: for each n in [min_match, max_match], n-gram -> end (exclusive) of its latest
    occurrence among the indexed ends. Incremental: ends indexed_upto.. are added when the sequence
    grows, so a step costs O((max_match - min_match + 1) * new tokens), never a rescan."""

    min_match: int
    max_match: int
    disable_batch_size: int = 0  # no n-gram drafts while the decode batch has more requests (0: no limit)
    tokens: list[int] = field(default_factory=list)  # the request's prompt + output, appended as it grows
    latest: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed_upto: int = 0  # n-grams ending before this position are indexed (n-grams of any n share `latest`)

    def sync(self, req: Req) -> None:
        """Append what the request produced since the last call (outputs only grow, retraction keeps them)."""
        if not self.tokens:
            self.tokens = list(req.input_ids)
        self.tokens += req.output_ids[len(self.tokens) - len(req.input_ids):]

    def extend_to(self, upto: int) -> None:
        """Index every n-gram that ends at a position e < upto (an occurrence [e - n, e))."""
        lo, hi, tokens = self.min_match, self.max_match, self.tokens
        for e in range(max(self.indexed_upto, lo), upto):
            for n in range(lo, min(hi, e) + 1):
                self.latest[tuple(tokens[e - n:e])] = e
        self.indexed_upto = max(self.indexed_upto, upto)

    def lookup(self, k: int) -> list[int]:
        """The k tokens that followed the latest earlier occurrence (ending at e) of the longest suffix of
        `tokens` (n from max_match down to min_match) that occurred before; [] when none did. Where fewer
        than k follow it (e > L - k: a repeat of period L - e), the repeat continues: draft[i] is
        (tokens + draft)[e + i], what follows the occurrence if the sequence keeps matching it."""
        tokens = self.tokens
        L = len(tokens)
        self.extend_to(L)  # ends < L: the suffix itself (end L) is not an earlier occurrence
        for n in range(min(self.max_match, L - 1), self.min_match - 1, -1):
            e = self.latest.get(tuple(tokens[L - n:]))
            if e is not None:
                out = tokens[e:e + k]
                while len(out) < k:
                    out.append(out[len(out) - (L - e)])
                return out
        return []


MAX_BACKOFF = 16  # most decode steps a request goes without drafts after its drafts kept failing


class NgramDrafter:
    """Prompt-lookup drafts for unconstrained requests, with a per-request draft length that halves
    after a rejection and grows by one after a fully accepted draft (req.spec_k). A draft of which
    nothing was accepted also pauses drafting for req.spec_backoff steps (doubling while they keep
    failing, up to MAX_BACKOFF; reset by any acceptance): a verification row costs compute (a decode row,
    model/runner.verify_as_decode)."""

    def __init__(self, cfg: NgramConfig, eos_token_ids: tuple[int, ...], context_len: int,
                 corpus: Optional[RadixCache] = None):
        self.cfg = cfg
        self.eos_token_ids = eos_token_ids
        self.context_len = context_len
        # the radix tree as a second source: where the request's own text has no match, what a cached request
        # with the same text so far went on to say (RadixCache.continuation); None: the own text only
        self.corpus = corpus
        self.corpus_drafted = 0  # draft tokens proposed from the corpus, all requests (stats)
        self.corpus_accepted = 0  # of which accepted

    def _draftable(self, req: Req) -> bool:
        sp = req.sampling
        return (req.grammar is None and not sp.has_penalties and sp.sampling_seed is None
                and len(req.output_ids) >= sp.min_new_tokens)

    def draft(self, req: Req) -> list[int]:
        if not self._draftable(req):
            return []
        if req.spec_skip > 0:
            req.spec_skip -= 1
            return []
        if req.spec_index is None:
            req.spec_index = NgramIndex(self.cfg.min_match, self.cfg.max_match)
            req.spec_k = self.cfg.num_draft_tokens
        # room for the model's own token, and every draft position inside the context
        k = min(req.spec_k, req.remaining_new_tokens - 1, self.context_len - req.seq_len - 1)
        if k <= 0:
            return []
        req.spec_index.sync(req)
        toks = req.spec_index.lookup(k)
        req.spec_from_corpus = not toks and self.corpus is not None
        if req.spec_from_corpus:
            toks = self.corpus.continuation(req.spec_index.tokens, k)
        sp = req.sampling
        finish = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(self.eos_token_ids))
        for j, t in enumerate(toks):
            if t in finish:
                toks = toks[:j]
                break
        if req.spec_from_corpus:
            self.corpus_drafted += len(toks)
        return toks

    def update(self, req: Req, drafted: int, accepted: int) -> None:
        """After a verification: count it and adapt the request's draft length."""
        req.spec_draft_tokens += drafted
        req.spec_accepted_tokens += accepted
        if req.spec_from_corpus:
            self.corpus_accepted += accepted
        req.spec_hits = DECAY * req.spec_hits + accepted
        req.spec_trials = DECAY * req.spec_trials + accepted + (accepted < drafted)  # up to the first rejection
        k_max = self.cfg.num_draft_tokens
        req.spec_k = min(k_max, req.spec_k + 1) if accepted == drafted else max(1, req.spec_k // 2)
        if accepted:
            req.spec_backoff = 0
        else:
            req.spec_backoff = min(MAX_BACKOFF, 2 * req.spec_backoff or 1)
            req.spec_skip = req.spec_backoff
