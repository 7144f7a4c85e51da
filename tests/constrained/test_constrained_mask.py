"""The batched mask: equal to a per-row reference, finish ids only at final states, applied in place
to constrained rows only; its cost per step at batch 32 is printed (no timed assertion)."""

from __future__ import annotations

import random
import time

import torch
from test_constrained_helpers import EOS, PERSON, REGEXES, TOOL_CALL, encode, regex_grammar, schema_grammar, vocab

from radixlang_runtime.constrained.mask import apply_mask, build_mask, mask_logits
from radixlang_runtime.constrained.state import GrammarState


def _random_states(n: int, seed: int) -> list[GrammarState]:
    """States along random walks of several grammars (sparse ones, and dense ones inside strings)."""
    rng = random.Random(seed)
    grammars = [schema_grammar(PERSON)] + [regex_grammar(p) for p in REGEXES[:5]] + [regex_grammar(r'"[^"]{0,30}"')]
    out = []
    while len(out) < n:
        g = rng.choice(grammars)
        gs = GrammarState(g, [EOS] + ([encode("\n")[0]] if rng.random() < 0.5 else []))
        for _ in range(rng.randrange(0, 12)):
            a = gs.allowed()
            if len(a.ids) == 0:
                break
            gs.advance(int(rng.choice(a.ids)))
        out.append(gs)
    return out


def _reference_row(gs: GrammarState, width: int) -> torch.Tensor:
    row = torch.zeros(width, dtype=torch.bool)
    for t in gs.grammar.allowed(gs.state).ids.tolist():
        row[t] = True
    for t in gs.finish_ids:
        row[t] = gs.is_final
    return row


def test_batched_mask_equals_per_row_reference():
    w = vocab().logits_width
    states = _random_states(48, 0)
    mask = build_mask(states, w, torch.device("cpu"))
    assert mask.shape == (48, w) and mask.dtype == torch.bool
    for i, gs in enumerate(states):
        assert torch.equal(mask[i], _reference_row(gs, w)), (i, gs)
    assert any(gs.is_final for gs in states) and any(not gs.is_final for gs in states)
    dense = [i for i, gs in enumerate(states) if len(gs.allowed().ids) * 16 > w]
    assert dense, "the sample should hold dense (string-interior) states too"
    again = build_mask(states, w, torch.device("cpu"))  # from the per-state tensor caches
    assert torch.equal(mask, again)


def test_apply_mask_touches_constrained_rows_only():
    w = vocab().logits_width
    states = _random_states(3, 1)
    logits = torch.randn(5, w)
    before = logits.clone()
    rows = [0, 2, 4]
    mask_logits(logits, rows, states)
    assert torch.equal(logits[[1, 3]], before[[1, 3]])
    for r, gs in zip(rows, states):
        ok = _reference_row(gs, w)
        assert torch.equal(logits[r][ok], before[r][ok])
        assert bool(torch.isinf(logits[r][~ok]).all())
    full = torch.randn(3, w)
    apply_mask(full, [0, 1, 2], build_mask(states, w, torch.device("cpu")))
    assert torch.isfinite(full).sum().item() == sum(int(_reference_row(gs, w).sum()) for gs in states)
    mask_logits(full, [], [])  # no constrained rows: nothing to do


def test_sampling_from_masked_logits_stays_in_the_grammar():
    """Greedy and random draws from masked logits walk the grammar to a final state."""
    w = vocab().logits_width
    g = schema_grammar(TOOL_CALL)  # bounded: every walk ends within ~120 tokens
    gen = torch.Generator().manual_seed(0)
    for greedy in (True, False):
        gs = GrammarState(g, [EOS])
        for _ in range(300):
            if gs.must_finish:
                break
            logits = torch.randn(1, w, generator=gen)
            mask_logits(logits, [0], [gs])
            if greedy:
                t = int(logits.argmax())
            else:
                t = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            assert gs.advance(t)
            if gs.terminated:
                break
        assert gs.is_final or gs.terminated


def test_row_with_nothing_allowed_falls_back_to_eos():
    gs = GrammarState(regex_grammar("(yes|no|maybe)"), [])
    assert gs.advance_all(encode("yes")) and gs.must_finish
    mask = build_mask([gs], vocab().logits_width, torch.device("cpu"))
    assert mask[0].nonzero().flatten().tolist() == [EOS]


def test_mask_cost_per_step_at_batch_32(capsys):
    w = vocab().logits_width
    states = _random_states(32, 2)
    build_mask(states, w, torch.device("cpu"))  # fill the per-state caches (once per state)
    logits = torch.randn(32, w)
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        mask_logits(logits, list(range(32)), states)
        times.append(time.perf_counter() - t0)
    times.sort()
    n_dense = sum(len(gs.allowed().ids) * 16 > w for gs in states)
    with capsys.disabled():
        print(f"\n[mask] batch 32 x {w}, CPU, {torch.get_num_threads()} threads, {n_dense} dense rows, cached "
              f"states: build + apply {times[0] * 1e3:.2f} ms min, {times[len(times) // 2] * 1e3:.2f} ms median")
