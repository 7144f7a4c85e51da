"""RadixCache against a naive reference model (every stored prefix -> the slot of its last token)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlang_runtime.mem.radix_cache import RadixCache

# Small alphabet and lengths so sequences share prefixes often.
seqs = st.lists(st.integers(0, 3), min_size=0, max_size=40)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), seqs),
        st.tuples(st.just("match_lock"), seqs),
        st.tuples(st.just("unlock"), st.integers(0, 10)),
        st.tuples(st.just("evict"), st.integers(0, 40)),
    ),
    max_size=40,
)


class Reference:
    """stored[page-aligned prefix] = the slots of its last page. Pages are owned whole: two
    sequences that differ inside a page share nothing of that page. Prefix-closed by construction."""

    def __init__(self, ps: int):
        self.ps = ps
        self.stored: dict[tuple, list[int]] = {}

    def match(self, ids: list[int]) -> list[int]:
        out, k = [], 0
        while k + self.ps <= len(ids) and tuple(ids[: k + self.ps]) in self.stored:
            out += self.stored[tuple(ids[: k + self.ps])]
            k += self.ps
        return out

    def insert(self, ids: list[int], slots: list[int]) -> None:
        for k in range(self.ps, len(ids) // self.ps * self.ps + 1, self.ps):
            self.stored.setdefault(tuple(ids[:k]), slots[k - self.ps : k])

    def values(self) -> list[int]:
        return sorted(s for page in self.stored.values() for s in page)


@pytest.mark.parametrize("ps", [1, 4, 16])
@settings(max_examples=150, deadline=None)
@given(program=ops)
def test_tree_matches_reference(ps, program):
    tree, ref = RadixCache(ps), Reference(ps)
    fresh = itertools.count()
    handed_out: set[int] = set()
    freed: set[int] = set()  # duplicates the caller freed, and evicted slots
    locks: list = []  # (node, slots protected by it)
    for op, arg in program:
        if op == "insert":
            ids = list(arg)
            slots = [next(fresh) for _ in ids]
            handed_out.update(slots)
            already = tree.insert(ids, slots)
            aligned = len(ids) // ps * ps
            assert already == len(ref.match(ids[:aligned]))  # what was stored before this insert
            ref.insert(ids, slots)
            freed.update(slots[:already])  # the caller frees its duplicates
            freed.update(slots[aligned:])  # and the unaligned tail it could not insert
        elif op == "match_lock":
            m = tree.match_prefix(arg)
            assert m.slots == ref.match(arg)  # the longest stored page-aligned prefix
            assert m.length == len(m.slots) and m.length % ps == 0
            tree.lock(m.last_node)
            locks.append((m.last_node, set(m.slots)))
        elif op == "unlock" and locks:
            node, _ = locks.pop(arg % len(locks))
            tree.unlock(node)
        elif op == "evict":
            evictable_before, evicted_before = tree.evictable_size(), tree.evicted_tokens_total
            out = tree.evict(arg)
            assert tree.evicted_tokens_total == evicted_before + len(out)
            protected = set().union(*[s for _, s in locks]) if locks else set()
            assert not protected & set(out), "a locked path was evicted"
            assert len(out) >= min(arg, evictable_before)  # unlocked leaves go until enough is freed
            freed.update(out)
            gone = set(out)
            ref.stored = {k: v for k, v in ref.stored.items() if not gone & set(v)}
        tree.check_integrity()
        assert tree.evictable_size() + tree.protected_size() == tree.total_size() == len(tree.all_slots())
        in_tree = tree.all_slots()
        assert len(set(in_tree)) == len(in_tree), "a slot is stored twice"
        assert not set(in_tree) & freed, "a freed slot is still in the tree"
        assert set(in_tree) | freed == handed_out, "a slot was lost"
        assert sorted(in_tree) == ref.values()
    for node, _ in locks:
        tree.unlock(node)
    assert tree.protected_size() == 0
    assert sorted(tree.reset()) == ref.values()
    assert tree.total_size() == 0


def test_evict_takes_least_recently_used_leaves_first():
    tree = RadixCache(1)
    tree.insert([1, 2, 3], [10, 11, 12])
    tree.insert([1, 2, 4], [10, 11, 13])
    tree.insert([5], [20])
    tree.match_prefix([1, 2, 3])  # touch 3: now 4 and 5 are older
    assert sorted(tree.evict(2)) == [13, 20]
    assert tree.match_prefix([1, 2, 3]).slots == [10, 11, 12]


def test_flush_refused_while_locked_and_dump():
    tree = RadixCache(2)
    tree.insert([1, 2, 3, 4, 5], [0, 1, 2, 3, 4])
    m = tree.match_prefix([1, 2, 3, 9])
    assert m.length == 2 and m.slots == [0, 1]
    tree.lock(m.last_node)
    with pytest.raises(RuntimeError, match="flush"):
        tree.reset()
    assert "lock=1" in tree.dump()
    tree.unlock(m.last_node)
    assert sorted(tree.reset()) == [0, 1, 2, 3]


def test_radix_cache_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, radixlang_runtime.mem.radix_cache; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_null_cache_answers_as_an_empty_tree_that_keeps_nothing():
    """--disable-radix-cache: no match, no continuation, nothing to evict, sizes 0; storing into it is a bug."""
    import pytest

    from radixlang_runtime.mem.null_cache import NullPrefixCache

    c = NullPrefixCache(16)
    m = c.match_prefix(list(range(64)))
    assert (m.length, m.slots, c.shares) == (0, [], False)
    assert c.continuation([1, 2, 3], 4) == [] and c.evict(100) == [] and c.reset() == []
    assert c.total_size() == c.evictable_size() == c.protected_size() == 0
    with pytest.raises(AssertionError, match="stores nothing"):
        c.insert([1, 2], [5, 6])
