"""Draft sources for the draft-verify path (torch-free): what a request proposes for the next forward
pass to verify (model/executor/sample_step.py accepts draft[j] while the token sampled at row j equals it).

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

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from radixlang_runtime.mem.radix_cache import RadixCache
from radixlang_runtime.speculative.accept_stats import AcceptStats

if TYPE_CHECKING:  # annotations only: the scheduler drives these, they never call it
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
PER_MATCH = 2  # a draft is at most this many tokens per token its source matched (NgramDrafter.draft)
MATCH_CAP = 64  # longest match NgramIndex.lookup measures
# MatchAgreement's buckets of match length: bucket b holds [MATCH_BOUNDS[b], MATCH_BOUNDS[b + 1])
MATCH_BOUNDS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
PRIOR_WEIGHT = 2.0  # MatchAgreement's prior, in observations
AGREE_DECAY = 0.98  # weight of the past in a bucket's counts, per observation in it


@dataclass
class MatchAgreement:
    """P(the model takes a draft token | the draft's source matched the text before it over m tokens), per
    bucket of m (MATCH_BOUNDS), from verifications: decayed counts over a prior of PRIOR_WEIGHT observations at
    the rule of succession's (m + 1) / (m + 2) (a source that matched m tokens in a row matches the next too).
    One per drafter, taught by every request's drafts: how far a source matched says more about its next token
    than which request drafted it (a copying request's long matches and a free one's short matches land in
    different buckets). Along an accepted draft the match grows: row j of a draft whose source matched m tokens is
    taken, if every row before it was, with probability p(m + j)."""

    hits: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BOUNDS))
    trials: list[float] = field(default_factory=lambda: [0.0] * len(MATCH_BOUNDS))

    def p(self, m: int) -> float:
        """m >= 1 (a draft's source matched at least its window's shortest n-gram)."""
        b = bisect.bisect_right(MATCH_BOUNDS, m) - 1
        return (self.hits[b] + PRIOR_WEIGHT * (m + 1) / (m + 2)) / (self.trials[b] + PRIOR_WEIGHT)

    def values(self, m: int, n: int) -> list[float]:
        """[n]: P(rows 0..j of a draft from a source matching m tokens are all taken), nonincreasing in j."""
        out, v = [], 1.0
        for j in range(n):
            v *= self.p(m + j)
            out.append(v)
        return out

    def observe(self, m: int, drafted: int, accepted: int) -> None:
        """A verified draft: rows 0..accepted-1 taken, row `accepted` (if drafted) refused, the rest unseen."""
        for j in range(min(drafted, accepted + 1)):
            b = bisect.bisect_right(MATCH_BOUNDS, m + j) - 1
            self.hits[b] = AGREE_DECAY * self.hits[b] + (j < accepted)
            self.trials[b] = AGREE_DECAY * self.trials[b] + 1.0


def trim_to_cost(reqs: list[Req], row_cost: float) -> None:
    """Before a step over `reqs`: cut each n-gram draft to the rows that pay for themselves. A step of M rows
    costs 1 + row_cost * M (units of the fixed part) and yields T expected tokens (one per request, plus
    the expected accepted draft tokens); a draft row of value v (req.spec_values[j]: P(rows 0..j are all
    taken), MatchAgreement.values) is kept when
    (T + v) / (1 + c (M + 1)) > T / (1 + c M), i.e. v (1 + c M) > c T. Rows are taken best first, so each
    request keeps a prefix of its draft (values fall along it). Small batches keep most rows (a row is
    nearly free while the weights' streaming dominates), large ones only drafts the model nearly always
    takes: throughput never drops by the model's estimate. Jump-forward drafts (constrained) count as
    rows worth one token each and are never cut."""
    if row_cost <= 0:
        return
    tokens = rows = float(len(reqs))
    cands = []
    for i, r in enumerate(reqs):
        if r.grammar is not None:
            tokens += len(r.draft)
            rows += len(r.draft)
        elif r.draft:
            cands += [(r.spec_values[j], i) for j in range(len(r.draft))]
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

    def lookup(self, k: int) -> tuple[list[int], int]:
        """(draft, m): the k tokens that followed the latest earlier occurrence (ending at e) of the longest
        suffix of `tokens` (n from max_match down to min_match) that occurred before, and m, how far that
        occurrence matches the suffix (n, extended back past max_match up to MATCH_CAP tokens); ([], 0) when
        none did. Where fewer than k follow it (e > L - k: a repeat of period L - e), the repeat continues:
        draft[i] is (tokens + draft)[e + i], what follows the occurrence if the sequence keeps matching it."""
        tokens = self.tokens
        L = len(tokens)
        self.extend_to(L)  # ends < L: the suffix itself (end L) is not an earlier occurrence
        for n in range(min(self.max_match, L - 1), self.min_match - 1, -1):
            e = self.latest.get(tuple(tokens[L - n:]))
            if e is not None:
                m = n
                while m < MATCH_CAP and m < e and tokens[e - m - 1] == tokens[L - m - 1]:
                    m += 1
                out = tokens[e:e + k]
                while len(out) < k:
                    out.append(out[len(out) - (L - e)])
                return out, m
        return [], 0


class NgramDrafter:
    """Prompt-lookup drafts for unconstrained requests. A draft's length follows how far its source matched:
    at most PER_MATCH tokens per matched token (a one-token match proposes 2 tokens, a 6-token one 12), up to
    num_draft_tokens; each of its rows carries P(it and the rows before it are taken) from MatchAgreement
    (req.spec_values), which trim_to_cost weighs against a row's cost at the step's batch size. So a request's
    drafts are long while it copies (its matches grow along the copy) and short or cut where it writes
    something new, step by step, without a per-request state machine to lag behind a switch between the two."""

    name = "NGRAM"  # --speculative-algorithm

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
        self.agree = MatchAgreement()  # P(a draft token is taken | its source's match length), all requests
        self.accept_stats = AcceptStats()  # accepted tokens per verification (stats, /metrics, the live view)

    def _draftable(self, req: Req) -> bool:
        sp = req.sampling
        return (req.grammar is None and not sp.has_penalties and sp.sampling_seed is None
                and len(req.output_ids) >= sp.min_new_tokens)

    def draft(self, req: Req) -> list[int]:
        if not self._draftable(req):
            return []
        if req.spec_index is None:
            req.spec_index = NgramIndex(self.cfg.min_match, self.cfg.max_match)
        # room for the model's own token, and every draft position inside the context
        k = min(self.cfg.num_draft_tokens, req.remaining_new_tokens - 1, self.context_len - req.seq_len - 1)
        if k <= 0:
            return []
        req.spec_index.sync(req)
        toks, req.spec_match = req.spec_index.lookup(k)
        toks = toks[:PER_MATCH * req.spec_match]
        req.spec_from_corpus = not toks and self.corpus is not None
        if req.spec_from_corpus:
            toks = self.corpus.continuation(req.spec_index.tokens, k)
            req.spec_match = MATCH_CAP  # a cached request said them after the whole text so far
        sp = req.sampling
        finish = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(self.eos_token_ids))
        for j, t in enumerate(toks):
            if t in finish:
                toks = toks[:j]
                break
        if req.spec_from_corpus:
            self.corpus_drafted += len(toks)
        req.spec_values = self.agree.values(req.spec_match, len(toks))
        return toks

    def update(self, req: Req, drafted: int, accepted: int) -> None:
        """After a verification: count it, and teach the agreement model."""
        req.spec_draft_tokens += drafted
        req.spec_accepted_tokens += accepted
        if req.spec_from_corpus:
            self.corpus_accepted += accepted
        self.agree.observe(req.spec_match, drafted, accepted)
        self.accept_stats.add(accepted)
