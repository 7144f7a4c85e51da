"""RadixAttention's prefix tree (torch-free): token ids -> KV slots, shared by all requests.

Invariants:
- every edge key is a whole number of pages (len % page_size == 0); children are looked up by their
  first token (page size 1) or first page; a node's `value` holds one slot per key token;
- lock_ref of a node counts the locks whose path runs through it (requests' matched prefixes and
  prefix pins, scheduler/kv_manager.py); a node with lock_ref > 0 is never evicted; the root is
  always locked;
- evictable_size + protected_size == total size (tokens stored), where protected counts the nodes
  with lock_ref > 0;
- the tree never frees memory: `insert` tells the caller how much it already held (the caller frees
  its duplicate slots) and `evict` / `reset` return slots for the allocator to take back.
The scheduler reaches it through scheduler/kv_manager.py, which moves slots between requests,
this tree and the allocator.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Hashable, Optional

# Namespaces of keys (a LoRA adapter, a cache_salt): mem/cache_namespace.py; re-exported for the tree's users
from radixlang_runtime.mem.cache_namespace import NAMESPACE_SHIFT, TOKEN_MASK  # noqa: F401


@dataclass(eq=False)
class TreeNode:
    key: list[int] = field(default_factory=list)
    value: list[int] = field(default_factory=list)  # slots, one per key token
    parent: Optional["TreeNode"] = None
    children: dict[Hashable, "TreeNode"] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    state: Optional[int] = None  # hybrid models: the snapshot slot of the recurrent state after the last key token


@dataclass
class MatchResult:
    length: int  # matched tokens, a multiple of page_size
    slots: list[int]  # one per matched token
    last_node: TreeNode  # lock this to protect the match


class RadixCache:
    shares = True  # computed tokens are inserted and shared (mem/null_cache.py: the cache that does not)

    def __init__(self, page_size: int = 1):
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = page_size
        self._tick = 0  # the access clock: +1 per match / insert
        self.evicted_tokens_total = 0  # tokens evicted by the LRU so far (not flushes)
        # called with each node `evict` is about to drop (still in the tree: path_to works), e.g. to
        # write its K/V to a lower tier (mem/hicache.py); flushes (`reset`) do not call it
        self.on_evict: Optional[Callable[[TreeNode], None]] = None
        self.freed_states: list[int] = []  # snapshot slots of nodes evict / reset dropped (the owner frees them)
        self.reset_tree()

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def clock_now(self) -> int:
        """The access clock's current value (node.last_access is a past value of it)."""
        return self._tick

    def reset_tree(self) -> None:
        self.root = TreeNode(lock_ref=1)
        self._evictable = 0
        self._protected = 0

    # ------------------------------------------------------------------ sizes
    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    # ------------------------------------------------------------------ lookups
    def _child_key(self, ids: list[int], pos: int) -> Hashable:
        return ids[pos] if self.page_size == 1 else tuple(ids[pos : pos + self.page_size])

    def _common_len(self, a: list[int], b: list[int], start: int) -> int:
        """Page-aligned length of the common prefix of a and b[start:]."""
        n = min(len(a), len(b) - start)
        i = 0
        while i + 64 <= n and a[i : i + 64] == b[start + i : start + i + 64]:  # slice compares run in C
            i += 64
        while i < n and a[i] == b[start + i]:
            i += 1
        return i // self.page_size * self.page_size

    def match_prefix(self, ids: list[int]) -> MatchResult:
        """Longest stored page-aligned prefix of ids. Updates LRU times along the path; a match that
        ends inside an edge splits it there (same content, finer structure) so the lock is exact."""
        ids = ids[: len(ids) // self.page_size * self.page_size]
        node, pos, slots = self.root, 0, []
        now = self._next_tick()
        node.last_access = now
        while pos < len(ids):
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                break
            n = self._common_len(child.key, ids, pos)
            if n == 0:
                break
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            slots.extend(child.value)
            node, pos = child, pos + n
        return MatchResult(pos, slots, node)

    def continuation(self, ids: list[int], k: int) -> list[int]:
        """Read-only (no locks, no access times touched): when the tree holds `ids` as a path from the root
        (whole or ending inside an edge), the first k tokens cached after it, following the most recently
        used child at each branch; [] when it does not or nothing follows. Work: one walk of len(ids)
        (slice compares) + k tokens; nothing is kept between calls, so eviction and splits never leave a
        stale reference behind. The n-gram drafter's corpus (speculative/drafter.py)."""
        node, pos, L, off = self.root, 0, len(ids), 0
        while pos < L:
            rest = L - pos
            if rest >= self.page_size:
                child = node.children.get(self._child_key(ids, pos))
            else:  # a partial page: the children's keys are whole pages
                child = next((c for c in node.children.values() if c.key[:rest] == ids[pos:]), None)
            if child is None:
                return []
            n = min(len(child.key), rest)
            if child.key[:n] != ids[pos:pos + n]:
                return []
            node, pos, off = child, pos + n, n
        out = node.key[off:off + k] if node is not self.root else []
        while len(out) < k and node.children:
            node = max(node.children.values(), key=lambda c: c.last_access)
            out += node.key[:k - len(out)]
        return out

    def _split(self, child: TreeNode, at: int) -> TreeNode:
        """child (key k) -> new (k[:at]) -> child (k[at:]); returns new."""
        parent = child.parent
        new = TreeNode(key=child.key[:at], value=child.value[:at], parent=parent,
                       lock_ref=child.lock_ref, last_access=child.last_access)
        parent.children[self._child_key(new.key, 0)] = new
        child.key, child.value, child.parent = child.key[at:], child.value[at:], new
        new.children[self._child_key(child.key, 0)] = child
        return new

    # ------------------------------------------------------------------ insert
    def insert(self, ids: list[int], slots: list[int]) -> int:
        """Store ids[:aligned] -> slots[:aligned]. Returns how many leading tokens were already
        stored: the caller frees its own slots for those positions (the tree keeps its copies)."""
        if len(ids) != len(slots):
            raise ValueError("insert needs one slot per token")
        n_total = len(ids) // self.page_size * self.page_size
        ids, slots = ids[:n_total], slots[:n_total]
        node, pos = self.root, 0
        now = self._next_tick()
        while pos < n_total:
            child = node.children.get(self._child_key(ids, pos))
            if child is None:
                leaf = TreeNode(key=ids[pos:], value=list(slots[pos:]), parent=node, last_access=now)
                node.children[self._child_key(ids, pos)] = leaf
                self._evictable += len(leaf.key)
                return pos
            n = self._common_len(child.key, ids, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, pos = child, pos + n
        return pos

    # ------------------------------------------------------------------ locks
    def lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise AssertionError("unlock without a matching lock")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._protected -= len(node.key)
                self._evictable += len(node.key)
            node = node.parent

    # ------------------------------------------------------------------ eviction
    def evict(self, num_tokens: int) -> list[int]:
        """Remove least-recently-used unlocked leaves until num_tokens slots are freed (or nothing is
        left to evict). Returns the slots; parents that become unlocked leaves are candidates next."""
        heap = [(n.last_access, id(n), n) for n in self._leaves() if n.lock_ref == 0]
        heapq.heapify(heap)
        out: list[int] = []
        while heap and len(out) < num_tokens:
            _, _, node = heapq.heappop(heap)
            if self.on_evict is not None:
                self.on_evict(node)
            out.extend(node.value)
            if node.state is not None:
                self.freed_states.append(node.state)
            parent = node.parent
            del parent.children[self._child_key(node.key, 0)]
            self._evictable -= len(node.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.evicted_tokens_total += len(out)
        return out

    def reset(self) -> list[int]:
        """Flush: drop everything and return every slot. Refuses while any path is locked."""
        if self._protected:
            raise RuntimeError("cannot flush the radix cache while requests hold parts of it")
        slots = [s for n in self._nodes() for s in n.value]
        self.freed_states += [n.state for n in self._nodes() if n.state is not None]
        self.reset_tree()
        return slots

    # ------------------------------------------------------------------ state snapshots (hybrid models)
    def state_ancestor(self, node: TreeNode) -> tuple[TreeNode, int]:
        """The deepest node on the path root .. node holding a state snapshot, and its depth in tokens
        (root, 0 when none does): where a hybrid model's match has to stop."""
        depth = sum(len(n.key) for n in self._path(node))
        while node is not self.root and node.state is None:
            depth -= len(node.key)
            node = node.parent
        return node, depth

    def _path(self, node: TreeNode) -> list[TreeNode]:
        out = []
        while node is not self.root:
            out.append(node)
            node = node.parent
        return out

    def drop_states(self, n: int) -> list[int]:
        """Free up to n snapshot slots of unlocked nodes, least recently used first (the nodes keep their K/V)."""
        held = sorted((nd.last_access, id(nd), nd) for nd in self._nodes() if nd.state is not None and nd.lock_ref == 0)
        out = []
        for _, _, nd in held[:n]:
            out.append(nd.state)
            nd.state = None
        return out

    def held_states(self) -> list[int]:
        return [n.state for n in self._nodes() if n.state is not None]

    # ------------------------------------------------------------------ inspection
    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def _leaves(self):
        return [n for n in self._nodes() if not n.children]

    def path_to(self, node: TreeNode) -> tuple[list[int], list[int]]:
        """Token ids and slots from the root down to node (inclusive)."""
        parts = []
        while node is not self.root:
            parts.append(node)
            node = node.parent
        ids: list[int] = []
        slots: list[int] = []
        for n in reversed(parts):
            ids.extend(n.key)
            slots.extend(n.value)
        return ids, slots

    def all_slots(self) -> list[int]:
        return [s for n in self._nodes() for s in n.value]

    def check_integrity(self) -> None:
        ev = pr = 0
        for n in self._nodes():
            if not n.key or len(n.key) % self.page_size or len(n.key) != len(n.value):
                raise AssertionError("radix node with an empty, unaligned or slot-less key")
            if n.parent.children.get(self._child_key(n.key, 0)) is not n:
                raise AssertionError("radix node not reachable by its first token/page")
            if n.lock_ref < 0 or (n.parent is not self.root and n.parent.lock_ref < n.lock_ref):
                raise AssertionError("lock_ref must not grow towards the leaves")
            if n.lock_ref:
                pr += len(n.key)
            else:
                ev += len(n.key)
        if (ev, pr) != (self._evictable, self._protected):
            raise AssertionError(f"radix accounting: counted {ev}/{pr}, recorded {self._evictable}/{self._protected}")

    def check_locks(self, holders: list[TreeNode]) -> None:
        """Every node's lock_ref equals the number of `holders` (each one lock on a node: a request's
        last_node, a pin's node) whose path runs through it, and every holder is still in the tree."""
        expected: dict[int, int] = {}
        for node in holders:
            while node is not self.root:
                if node.parent is None or node.parent.children.get(self._child_key(node.key, 0)) is not node:
                    raise AssertionError("a lock holder's node is no longer in the tree")
                expected[id(node)] = expected.get(id(node), 0) + 1
                node = node.parent
        for n in self._nodes():
            if n.lock_ref != expected.get(id(n), 0):
                raise AssertionError(f"radix node lock_ref {n.lock_ref}, but {expected.get(id(n), 0)} holders")

    def dump(self, max_tokens: int = 8) -> str:
        """A compact text view, one node a line: depth, tokens (first few), slots count, lock_ref."""
        lines: list[str] = []

        def walk(node: TreeNode, depth: int) -> None:
            for child in node.children.values():
                head = child.key[:max_tokens]
                more = "..." if len(child.key) > max_tokens else ""
                lines.append(f"{'  ' * depth}{head}{more} len={len(child.key)} lock={child.lock_ref}")
                walk(child, depth + 1)

        walk(self.root, 0)
        return "\n".join(lines) or "(empty)"
