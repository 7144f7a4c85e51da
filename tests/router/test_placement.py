"""Data-parallel placement (placement.py): policy decisions, load accounting, tree capacity, and a
state machine against a reference model (loads per replica; for cache_aware without eviction, the
exact choice from naive per-replica sets of routed prompts)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radixlang_runtime.placement import POLICIES, Placement, PlacementConfig


def prompt(prefix: int, suffix: int, prefix_len: int = 200, suffix_len: int = 8) -> list[int]:
    """A prompt of a shared prefix (ids unique to `prefix`) and a per-request suffix."""
    head = [prefix * 100_000 + i for i in range(prefix_len)]
    return head + [10_000_000 + suffix * suffix_len + i for i in range(suffix_len)]


# ---------------------------------------------------------------------------- cache_aware
def test_shared_prefix_sticks_to_one_replica():
    r = Placement(4)
    picks = []
    for i in range(20):
        picks.append(r.route(f"r{i}", prompt(7, i)))
        if i % 3 == 2:  # a little concurrency, loads stay balanced
            r.finish(f"r{i - 1}")
        r.check_integrity()
    assert len(set(picks)) == 1, picks
    st_ = r.stats()
    assert st_["cache_routed"] == 19 and st_["balance_routed"] == 0 and st_["smallest_tree_routed"] == 1


def test_distinct_prefixes_closed_loop_partition_replicas():
    rng = random.Random(0)
    r = Placement(2)
    where: dict[int, set[int]] = {p: set() for p in range(4)}
    in_flight: list[str] = []
    for i in range(200):
        p = rng.randrange(4)
        rid = f"p{p}-{i}"
        where[p].add(r.route(rid, prompt(p, i)))
        in_flight.append(rid)
        if len(in_flight) >= 8:  # closed loop: at most 8 in flight, a random one ends
            r.finish(in_flight.pop(rng.randrange(len(in_flight))))
        r.check_integrity()
    assert all(len(reps) == 1 for reps in where.values()), where
    assert {next(iter(reps)) for reps in where.values()} == {0, 1}
    assert r.stats()["balance_routed"] == 0


def test_new_prefixes_spread_to_the_smallest_tree():
    r = Placement(3)
    assert [r.route(f"a{p}", prompt(p, 0)) for p in range(3)] == [0, 1, 2]
    # Trees now equal in size: the tie goes to the lower load, then the lowest index.
    r.finish("a1")
    assert r.route("b", prompt(3, 0)) == 1
    assert r.stats()["smallest_tree_routed"] == 4


def test_cache_threshold_is_strict():
    r = Placement(2, PlacementConfig(cache_threshold=0.5))
    assert r.route("a", list(range(10))) == 0
    r.finish("a")
    # 5 of 10 tokens match replica 0 (rate 0.5, not > 0.5): replica 1's tree is smaller.
    assert r.route("b", list(range(5)) + [100 + i for i in range(5)]) == 1
    r.finish("b")
    # 6 of 10 match replica 0: follow the cache.
    assert r.route("c", list(range(6)) + [200 + i for i in range(4)]) == 0
    assert r.stats()["cache_routed"] == 1


def test_equal_matches_go_to_the_lower_load():
    r = Placement(2, PlacementConfig(balance_abs_threshold=0, balance_rel_threshold=3.0))
    assert r.route("a", [1, 2, 3, 4]) == 0
    assert r.route("b", [1, 2, 3, 4]) == 1  # loads 1 vs 0: 1 > 0 and 1 > 0 * 3, least loaded
    assert r.route("c", [9]) == 0  # no match: equal trees, equal loads, lowest index
    # Loads 2 vs 1 (2 <= 1 * 3: balanced); both trees match all 4 tokens: the lower load wins.
    assert r.route("d", [1, 2, 3, 4, 5]) == 1
    assert r.stats()["cache_routed"] == 1


def test_imbalance_sends_to_least_loaded():
    r = Placement(2)
    picks = [r.route(f"r{i}", prompt(1, i)) for i in range(40)]
    # 33 in flight on replica 0 vs 0: 33 - 0 > 32, so the 34th goes to replica 1.
    assert picks[:33] == [0] * 33
    assert picks[33] == 1
    assert 1 in picks[34:]
    loads = r.loads()
    assert max(loads) - min(loads) <= 33 and sum(loads) == 40
    assert r.stats()["balance_routed"] >= 1
    r.check_integrity()


@pytest.mark.parametrize("rel, stays", [(10.0, True), (1.0001, False)])
def test_relative_imbalance_threshold(rel, stays):
    r = Placement(2, PlacementConfig(balance_rel_threshold=rel))
    assert r.route("seed", prompt(2, 0)) == 0
    assert [r.route(f"q{i}", prompt(3, i)) for i in range(5)] == [1] * 5
    picks = [r.route(f"p{i}", prompt(2, i + 1)) for i in range(39)]
    # Loads reach 38 vs 5: the gap 33 > 32, but 38 <= 5 * 10 keeps following the cache.
    assert (picks == [0] * 39) == stays
    assert (r.stats()["balance_routed"] == 0) == stays
    r.check_integrity()


# ---------------------------------------------------------------------------- other policies
def test_round_robin_rotates():
    r = Placement(3, PlacementConfig(policy="round_robin"))
    picks = []
    for i in range(7):
        picks.append(r.route(f"r{i}", prompt(0, 0)))
        r.finish(f"r{i}")  # loads and the cache do not matter
    assert picks == [0, 1, 2, 0, 1, 2, 0]
    assert r.stats()["routed"] == [3, 2, 2]


def test_shortest_queue_follows_finishes():
    r = Placement(3, PlacementConfig(policy="shortest_queue"))
    assert [r.route(f"r{i}", [1, 2, 3]) for i in range(4)] == [0, 1, 2, 0]
    assert r.loads() == [2, 1, 1]
    r.finish("r2")
    assert r.route("x", [1, 2, 3]) == 2
    r.finish("r0")
    r.finish("r3")
    assert r.loads() == [0, 1, 1]
    assert r.route("y", [1, 2, 3]) == 0
    r.check_integrity()


# ---------------------------------------------------------------------------- lifecycle
def test_finish_is_idempotent_and_unknown_rids_are_noops():
    r = Placement(2)
    rep = r.route("a", [1, 2, 3])
    assert r.replica_of("a") == rep
    r.finish("a")
    assert r.replica_of("a") is None
    r.finish("a")
    r.finish("never-routed")
    assert r.loads() == [0, 0]
    r.check_integrity()


def test_duplicate_in_flight_rid_raises_and_finished_rid_can_return():
    r = Placement(2)
    r.route("a", [1, 2])
    with pytest.raises(ValueError, match="already in flight"):
        r.route("a", [3, 4])
    assert r.loads() == [1, 0]  # the refused route changed nothing
    r.finish("a")
    r.route("a", [3, 4])
    assert sum(r.loads()) == 1
    r.check_integrity()


@pytest.mark.parametrize("kwargs, needle", [
    ({"policy": "random"}, "shortest_queue"),
    ({"cache_threshold": 1.5}, "cache_threshold"),
    ({"cache_threshold": -0.1}, "cache_threshold"),
    ({"balance_abs_threshold": -1}, "balance_abs_threshold"),
    ({"balance_rel_threshold": 0.5}, "balance_rel_threshold"),
    ({"balance_rel_threshold": float("nan")}, "balance_rel_threshold"),
    ({"tree_capacity_tokens": 0}, "tree_capacity_tokens"),
])
def test_bad_config_raises(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        PlacementConfig(**kwargs)


def test_bad_policy_names_the_allowed_values():
    with pytest.raises(ValueError) as e:
        PlacementConfig(policy="lpm")
    assert "'lpm'" in str(e.value) and all(p in str(e.value) for p in POLICIES)


@pytest.mark.parametrize("n", [0, -1])
def test_bad_num_replicas_raises(n):
    with pytest.raises(ValueError, match="num_replicas"):
        Placement(n)


def test_empty_and_tuple_inputs():
    r = Placement(2)
    assert r.route("a", []) == 0  # match rate 0: smallest tree (all empty), lowest load
    assert r.route("b", ()) == 1
    assert r.route("c", (5, 6, 7)) == 0
    r.finish("c")
    assert r.route("d", [5, 6, 7, 8]) == 0  # the tuple was stored as a comparable key
    assert r.stats()["tree_tokens"] == [4, 0]
    r.check_integrity()


def test_reset_trees_keeps_loads():
    r = Placement(2)
    r.route("a", prompt(0, 0))
    r.route("b", prompt(1, 0))
    r.reset_trees()
    st_ = r.stats()
    assert st_["tree_tokens"] == [0, 0] and st_["loads"] == [1, 1] and st_["routed"] == [1, 1]
    r.check_integrity()


def test_stats_shape():
    r = Placement(2, PlacementConfig(policy="shortest_queue"))
    r.route("a", [1, 2, 3])
    assert r.stats() == {"policy": "shortest_queue", "loads": [1, 0], "tree_tokens": [3, 0], "routed": [1, 0],
                         "cache_routed": 0, "balance_routed": 0, "smallest_tree_routed": 0}


# ---------------------------------------------------------------------------- tree capacity
def test_tree_capacity_enforced_and_newest_prompt_kept():
    cap = 500
    rng = random.Random(1)
    r = Placement(2, PlacementConfig(tree_capacity_tokens=cap))
    for i in range(300):
        ids = [rng.randrange(6) for _ in range(rng.randrange(1, 120))]
        rep = r.route(f"r{i}", ids)
        r.finish(f"r{i}")
        assert max(r.stats()["tree_tokens"]) <= cap
        assert r._trees[rep].match_prefix(ids).length == len(ids)  # eviction spared the newest prompt
    r.check_integrity()
    assert sum(t.evicted_tokens_total for t in r._trees) > 0


def test_prompt_longer_than_capacity_keeps_its_head():
    r = Placement(1, PlacementConfig(tree_capacity_tokens=100))
    r.route("a", list(range(50, 80)))
    r.route("b", list(range(1000)))
    assert r.stats()["tree_tokens"] == [100]
    assert r._trees[0].match_prefix(list(range(1000))).length == 100
    r.check_integrity()


def test_router_does_not_import_torch():
    code = "import sys, radixlang_runtime.placement; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---------------------------------------------------------------------------- state machine
def common_len(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class RouterMachine(RuleBasedStateMachine):
    """Reference: rid -> replica for in-flight requests, and per replica the set of prompts routed there.
    While no tree has ever exceeded its capacity, the reference predicts every decision exactly."""

    @initialize(policy=st.sampled_from(POLICIES), m=st.integers(1, 4), abs_thr=st.integers(0, 3),
                rel_thr=st.sampled_from([1.0001, 1.5, 3.0]), cache_thr=st.sampled_from([0.0, 0.5, 0.9]),
                cap=st.sampled_from([12, 1 << 20]))
    def setup(self, policy, m, abs_thr, rel_thr, cache_thr, cap):
        self.cfg = PlacementConfig(policy=policy, cache_threshold=cache_thr, balance_abs_threshold=abs_thr,
                                balance_rel_threshold=rel_thr, tree_capacity_tokens=cap)
        self.placement = Placement(m, self.cfg)
        self.m = m
        self.in_flight: dict[str, int] = {}
        self.prompts: list[set[tuple[int, ...]]] = [set() for _ in range(m)]
        self.exact = True  # no eviction yet: trees equal the reference sets
        self.rr = 0
        self.next_rid = 0

    def loads(self) -> list[int]:
        out = [0] * self.m
        for rep in self.in_flight.values():
            out[rep] += 1
        return out

    def tree_tokens(self, rep: int) -> int:
        return len({p[:k] for p in self.prompts[rep] for k in range(1, len(p) + 1)})

    def expected(self, ids: list[int]) -> int | None:
        loads, reps = self.loads(), range(self.m)
        if self.cfg.policy == "round_robin":
            return self.rr
        if self.cfg.policy == "shortest_queue" or (
                max(loads) - min(loads) > self.cfg.balance_abs_threshold
                and max(loads) > min(loads) * self.cfg.balance_rel_threshold):
            return min(reps, key=lambda i: (loads[i], i))
        if not self.exact:
            return None
        match = [max((common_len(list(p), ids) for p in self.prompts[i]), default=0) for i in reps]
        best = min(reps, key=lambda i: (-match[i], loads[i], i))
        if ids and match[best] / len(ids) > self.cfg.cache_threshold:
            return best
        return min(reps, key=lambda i: (self.tree_tokens(i), loads[i], i))

    @rule(ids=st.lists(st.integers(0, 2), max_size=8))
    def route(self, ids):
        rid = f"r{self.next_rid}"
        self.next_rid += 1
        want = self.expected(ids)
        got = self.placement.route(rid, ids)
        assert 0 <= got < self.m
        if want is not None:
            assert got == want, (self.cfg, self.loads(), ids, got, want)
        self.rr = (self.rr + 1) % self.m
        self.in_flight[rid] = got
        self.prompts[got].add(tuple(ids[: self.cfg.tree_capacity_tokens]))
        if self.tree_tokens(got) > self.cfg.tree_capacity_tokens:
            self.exact = False

    @rule(ids=st.lists(st.integers(0, 2), max_size=8), data=st.data())
    def route_duplicate(self, ids, data):
        if not self.in_flight:
            return
        rid = data.draw(st.sampled_from(sorted(self.in_flight)))
        with pytest.raises(ValueError):
            self.placement.route(rid, ids)

    @rule(data=st.data())
    def finish(self, data):
        rid = data.draw(st.sampled_from(sorted(self.in_flight) + ["unknown"]))
        self.placement.finish(rid)
        self.in_flight.pop(rid, None)

    @rule()
    def reset_trees(self):
        self.placement.reset_trees()
        self.prompts = [set() for _ in range(self.m)]
        self.exact = True

    @invariant()
    def consistent(self):
        if not hasattr(self, "router"):
            return
        self.placement.check_integrity()
        assert self.placement.loads() == self.loads()
        assert all(self.placement.replica_of(rid) == rep for rid, rep in self.in_flight.items())
        st_ = self.placement.stats()
        assert sum(st_["routed"]) == self.next_rid
        if self.exact:
            assert st_["tree_tokens"] == [self.tree_tokens(i) for i in range(self.m)]


RouterMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_router_machine = RouterMachine.TestCase


# ---------------------------------------------------------------------------- eligible replicas
@pytest.mark.parametrize("policy", POLICIES)
def test_eligible_limits_every_policy(policy):
    r = Placement(3, PlacementConfig(policy))
    for i in range(4):  # the shared prefix lands on one replica
        r.route(f"w{i}", prompt(1, i), eligible=[0, 1, 2])
    home = r.replica_of("w0")
    others = [i for i in range(3) if i != home]
    picks = {r.route(f"e{i}", prompt(1, 100 + i), eligible=others) for i in range(6)}
    assert picks <= set(others)
    assert r.route("only", prompt(1, 999), eligible=[home]) == home
    r.check_integrity()
    with pytest.raises(ValueError, match="eligible"):
        r.route("none", prompt(1, 5), eligible=[])
    with pytest.raises(ValueError, match="eligible"):
        r.route("bad", prompt(1, 5), eligible=[3])


def test_round_robin_skips_ineligible_in_turn():
    r = Placement(3, PlacementConfig("round_robin"))
    assert [r.route(f"a{i}", [i], eligible=[0, 2]) for i in range(4)] == [0, 2, 0, 2]
    assert [r.route(f"b{i}", [i]) for i in range(3)] == [0, 1, 2]
