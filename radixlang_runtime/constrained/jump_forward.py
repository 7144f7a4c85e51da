"""Jump-forward: tokens the grammar forces, appended without sampling. Torch-free.

1. Forced bytes come from the Index itself: at a non-final state, byte b is forced iff every allowed
   token starts with b; the next state is the one after the single-byte token for b. Repeat until no
   byte is forced, a final state, or MAX_FORCED_BYTES. No second automaton, no dialect mismatch.
   A matcher backend (xgrammar, llguidance: matcher_grammar.py) names its forced string itself
   (find_jump_forward_string / compute_ff_bytes); it is walked through the same states, and cut where
   the mask disagrees, so the invariant below holds for every backend.
2. Forced bytes -> tokens: tokenize the whole UTF-8 characters of the forced bytes F (n bytes, states
   s_0..s_n) with the tokenizer, then hold back the tail: h = the first position q < n where an
   allowed token at s_q starts with F[q:] and runs past n (after `{"name"` the model keeps `": `, so
   it can still pick `":"`-like merges). Only tokens ending at or before h are forced; each is also
   walked through the Index (a token the Index refuses, e.g. a special token the text spelled, ends
   the run there).
3. Sampled tokens are never rewritten: forcing starts at the state after the last sampled token.

Per state the result is cached on the CompiledGrammar (the first time walks the Index and runs the
tokenizer, then a dict lookup; docs/PERFORMANCE.md#grammar-and-jump-forward).
Invariant: forced_tokens(state) advances the state over exactly the tokens it returns, and the
bytes of those tokens are a prefix of the state's forced bytes.

4. Guesses past the hold-back (guess_tokens): the held-back tail is not forced, but the tokenizer's split
   of it is what a tokenizer-trained model usually writes (` "` before a string's text), so drafts append
   it; the model verifies it like any draft token (greedy text unchanged; a wrong guess is one extra row).
5. Drafts that follow the model (draft_tokens): the runtime verifies forced tokens as a draft, and a
   model often spells forced text with other tokens than the tokenizer's canonical split (SmolLM2
   writes `{` then `"` where the tokenizer has `{"`), so such drafts are rejected at that token. Each
   rejection teaches the grammar: at that state the model chose token x (`learn_rejection`); the next
   draft through that state drafts x instead and re-derives the forced tokens after it. A learned token
   is allowed by the grammar at that state but may run past the forced bytes: draft_tokens' output is
   a guess for the model to verify, never appended unverified. Greedy outputs are unchanged either way.
   "That state" is pref_key's: the automaton state (outlines), or the forced bytes there for a matcher
   backend, whose states are token paths that other outputs never revisit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from radixlang_runtime.constrained.grammar import CompiledGrammar
from radixlang_runtime.constrained.state import GrammarState

MAX_FORCED_BYTES = 1024  # per run; a longer forced stretch continues in the next run
MAX_RUNS = 64  # runs per forced_tokens call (each run is cached, this only bounds the loop)
MAX_RUN_TOKENS = 64  # a matcher's own forced tokens walked per run (each walked token costs a mask)


@dataclass(frozen=True)
class ForcedBytes:
    data: bytes  # bytes every continuation of the state starts with
    states: tuple[int, ...]  # len(data) + 1: states[k] = the state after data[:k]


@dataclass(frozen=True)
class ForcedRun:
    token_ids: tuple[int, ...]  # forced tokens from the state
    end_state: int  # the state after them
    held_back: int  # forced bytes left to the model (hold-back and partial UTF-8)
    # the tokenizer's split of the held-back bytes (whole characters), each allowed by the grammar: not
    # forced (a longer token could start there), but a good guess for a draft the model verifies
    guess: tuple[int, ...] = ()
    forced: bytes = b""  # the forced bytes at the state (the tokens' bytes where the backend names tokens)


def _backend_forced_bytes(g: Any, state: int) -> tuple[bytearray, list[int]]:
    """The matcher's own forced string (MatcherGrammar.forced_prefix), walked byte by byte through
    next_state with the single-byte tokens: cut where the mask would stop or the output could end."""
    v = g.vocab
    data, states, s = bytearray(), [state], state
    for b in g.forced_prefix(state)[:MAX_FORCED_BYTES]:
        tok = int(v.single_byte_ids[b])
        nxt = g.next_state(s, tok) if tok >= 0 and not g.is_final(s) else None
        if nxt is None:
            break
        data.append(b)
        s = nxt
        states.append(s)
    return data, states


def forced_bytes(g: CompiledGrammar, state: int) -> ForcedBytes:
    """The backend's forced string when it names one, then byte by byte from the allowed sets."""
    v = g.vocab
    data, states = _backend_forced_bytes(g, state) if hasattr(g, "forced_prefix") else (bytearray(), [state])
    s = states[-1]
    while len(data) < MAX_FORCED_BYTES and not g.is_final(s):
        ids = g.allowed(s).ids
        if len(ids) == 0:
            break
        first = v.first_byte[ids]
        b = int(first[0])
        if b < 0 or bool((first != b).any()):
            break
        tok = int(v.single_byte_ids[b])
        nxt = g.next_state(s, tok) if tok >= 0 else None
        if nxt is None:
            break
        data.append(b)
        s = nxt
        states.append(s)
    return ForcedBytes(bytes(data), tuple(states))


def _any_allowed(allowed_sorted: np.ndarray, cands: np.ndarray) -> bool:
    if len(cands) == 0 or len(allowed_sorted) == 0:
        return False
    pos = np.searchsorted(allowed_sorted, cands)
    ok = pos < len(allowed_sorted)
    return bool((allowed_sorted[pos[ok]] == cands[ok]).any())


def hold_back_point(g: CompiledGrammar, fb: ForcedBytes) -> int:
    """The first position q where an allowed token could start inside the forced bytes and run past
    their end; len(data) when there is none."""
    n = len(fb.data)
    for q in range(n):
        cands = g.vocab.ids_with_prefix(fb.data[q:], n - q)
        if _any_allowed(g.allowed(fb.states[q]).ids, cands):
            return q
    return n


def _utf8_prefix_len(b: bytes) -> int:
    for cut in range(len(b), max(len(b) - 4, -1), -1):
        try:
            b[:cut].decode("utf-8")
            return cut
        except UnicodeDecodeError:
            continue
    return 0


def forced_run(g: CompiledGrammar, state: int) -> ForcedRun:
    """The forced tokens from `state` (cached per state)."""
    hit = g.forced_cache.get(state)
    if hit is not None:
        return hit
    run = ForcedRun((), state, 0)
    backend_tokens = g.forced_token_ids(state) if hasattr(g, "forced_token_ids") else None
    if backend_tokens is not None:  # the matcher's own split (llguidance): walked through the mask's states
        out, s = [], state
        for t in backend_tokens[:MAX_RUN_TOKENS]:
            nxt = g.next_state(s, t) if not g.is_final(s) else None
            if nxt is None:
                break
            out.append(t)
            s = nxt
        run = ForcedRun(tuple(out), s, 0, forced=b"".join(g.vocab.token_bytes[t] or b"" for t in out))
        g.forced_cache.put(state, run)
        return run
    fb = forced_bytes(g, state)
    encode = g.vocab.encode
    if fb.data and encode is not None:
        h = hold_back_point(g, fb)
        m = _utf8_prefix_len(fb.data)
        out: list[int] = []
        pos, s = 0, state
        if h > 0 and m > 0:
            for t in encode(fb.data[:m].decode("utf-8")):
                tb = g.vocab.token_bytes[t] if 0 <= t < g.vocab.logits_width else None
                if tb is None or pos + len(tb) > h or fb.data[pos:pos + len(tb)] != tb:
                    break
                nxt = g.next_state(s, t)
                if nxt is None:
                    break
                out.append(t)
                pos += len(tb)
                s = nxt
        run = ForcedRun(tuple(out), s, len(fb.data) - pos, _guess(g, fb.data[pos:m], s), fb.data)
    g.forced_cache.put(state, run)
    return run


def _guess(g: CompiledGrammar, data: bytes, state: int) -> tuple[int, ...]:
    """The tokenizer's tokens of `data` from `state`, while each spells the next bytes and is allowed."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # a token boundary inside a character: no guess
        return ()
    out: list[int] = []
    pos, s = 0, state
    for t in g.vocab.encode(text) if text else ():
        tb = g.vocab.token_bytes[t] if 0 <= t < g.vocab.logits_width else None
        nxt = g.next_state(s, t) if tb is not None and data[pos:pos + len(tb)] == tb else None
        if nxt is None:
            break
        out.append(t)
        pos += len(tb)
        s = nxt
    return tuple(out)


def guess_tokens(gs: GrammarState, max_tokens: Optional[int] = None) -> list[int]:
    """After forced_tokens / draft_tokens: the held-back bytes' tokens (ForcedRun.guess), advancing `gs` over
    them. For drafts only: the model verifies each, so a wrong guess costs one extra row, never a token."""
    if gs.terminated or (max_tokens is not None and max_tokens <= 0):
        return []
    take = list(forced_run(gs.grammar, gs.state).guess[:max_tokens])
    stop = [k for k, t in enumerate(take) if t in gs.finish_ids]
    if stop:
        take = take[: stop[0]]
    for t in take:
        ok = gs.advance(t)
        assert ok, "a guessed token was refused by the grammar"
    return take


def forced_tokens(gs: GrammarState, max_tokens: Optional[int] = None) -> list[int]:
    """Tokens to append after the last sampled one (advancing `gs` over them); [] when the model must
    choose. max_tokens caps the count (remaining max_new_tokens); the state advances only over those
    returned. Call after every advance() of a sampled token, and once at admission."""
    out: list[int] = []
    for _ in range(MAX_RUNS):
        if gs.terminated or (max_tokens is not None and len(out) >= max_tokens):
            break
        run = forced_run(gs.grammar, gs.state)
        take = run.token_ids
        if max_tokens is not None:
            take = take[: max_tokens - len(out)]
        stop = [k for k, t in enumerate(take) if t in gs.finish_ids]
        if stop:  # a stop id that is also a text token ends the request: leave it to the model
            take = take[: stop[0]]
        if not take:
            break
        for t in take:
            ok = gs.advance(t)
            assert ok, "a forced token was refused by the index"
        out.extend(take)
        if len(take) < len(run.token_ids) or run.held_back > 0:
            break
    gs.num_forced += len(out)
    return out


def pref_key(g: Any, state: int) -> Any:
    """draft_prefs' key for a state. A CompiledGrammar's states are its automaton's, so paths that reach one
    grammar state share its key. A matcher grammar's states are token paths (matcher_grammar.py): keyed by
    the path, what one output taught (after `"age": 34`) would never reach another output (after `"age": 7`),
    though both stand before the same forced text; its key is the state's forced bytes instead (a learned
    token is still only drafted where the grammar allows it, and the model verifies it)."""
    if not hasattr(g, "forced_prefix"):
        return state
    return forced_run(g, state).forced


def draft_tokens(gs: GrammarState, max_tokens: Optional[int] = None) -> list[int]:
    """forced_tokens, with the tokens the model chose at rejected drafts (learn_rejection) put in
    place of the canonical ones; advances `gs` over exactly the tokens it returns."""
    g = gs.grammar
    out: list[int] = []
    for _ in range(MAX_RUNS):
        left = None if max_tokens is None else max_tokens - len(out)
        if left == 0:
            break
        toks = forced_tokens(gs.copy(), left)
        swapped = False
        for t in toks:
            x = g.draft_prefs.get(pref_key(g, gs.state)) if len(g.draft_prefs) else None
            if x is not None and x != t and x not in gs.finish_ids and gs.advance(x):
                out.append(x)
                swapped = True  # the forced tokens after x differ: derive them again
                break
            ok = gs.advance(t)
            assert ok, "a forced token was refused by the index"
            out.append(t)
        if not swapped:
            break
    gs.num_forced += len(out)
    return out


def learn_rejection(gs_before: GrammarState, chosen: int) -> None:
    """The model rejected a draft token at the state `gs_before` and chose `chosen` (a sampled token,
    allowed there by the mask): draft_tokens drafts it at that state from now on."""
    if chosen not in gs_before.finish_ids and gs_before.grammar.next_state(gs_before.state, chosen) is not None:
        g = gs_before.grammar
        key = pref_key(g, gs_before.state)
        if key != b"":  # a matcher state with nothing forced: draft_tokens never asks there
            g.draft_prefs.put(key, chosen)
