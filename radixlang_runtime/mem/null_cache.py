"""NullPrefixCache: the prefix cache of --disable-radix-cache (torch-free).

It answers RadixCache's questions as an empty tree that never keeps anything (no match, nothing to evict,
sizes 0, no continuation for drafts), so its users hold one kind of cache and never test for None; the
one difference they ask about is `shares`: whether computed tokens are given to the cache at all (a
finished request's slots are then freed whole). Storing into it is a bug (insert raises).
"""

from __future__ import annotations

from radixlang_runtime.mem.radix_cache import MatchResult, TreeNode


class NullPrefixCache:
    shares = False  # computed tokens are never shared: callers free them instead of inserting

    def __init__(self, page_size: int = 1):
        self.page_size = page_size
        self.root = TreeNode()
        self.evicted_tokens_total = 0
        self.on_evict = None

    def clock_now(self) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0

    def match_prefix(self, ids: list[int]) -> MatchResult:
        return MatchResult(0, [], self.root)

    def continuation(self, ids: list[int], k: int) -> list[int]:
        return []

    def insert(self, ids: list[int], slots: list[int]) -> int:
        raise AssertionError("the null prefix cache stores nothing (its users check `shares`)")

    def lock(self, node: TreeNode) -> None:
        pass

    def unlock(self, node: TreeNode) -> None:
        pass

    def evict(self, num_tokens: int) -> list[int]:
        return []

    def reset(self) -> list[int]:
        return []

    def all_slots(self) -> list[int]:
        return []

    def check_integrity(self) -> None:
        pass

    def check_locks(self, holders: list[TreeNode]) -> None:
        pass
