"""A bounded summary of the radix tree for the live view (/dashboard). Torch-free.

The tree can hold tens of thousands of nodes; the page shows at most `max_nodes` of them: the
biggest subtrees first (best-first from the root by subtree size), every other child folded into its
parent's `hidden` counts. One pass over the tree computes subtree sizes (O(nodes)), the expansion
is O(shown log shown). Token ids leave only with `with_ids` (the server decodes them to text only
under --dashboard-show-text); otherwise a node is its sizes, locks and age.

Invariants of the result: every shown node's parent is shown (or is the root, id 0); for each shown
node, tokens + sum(shown children's subtree_tokens) + hidden_tokens == subtree_tokens; the whole
tree's token total is the root's subtree_tokens.
"""

from __future__ import annotations

import heapq
from typing import Any

from radixlang_runtime.mem.radix_cache import TOKEN_MASK, RadixCache, TreeNode

HEAD_IDS = 24  # token ids per node sent for the text label (with_ids only)


def summarize_tree(cache: RadixCache, max_nodes: int = 300, with_ids: bool = False,
                   pinned: frozenset[int] = frozenset()) -> dict[str, Any]:
    """-> {"nodes": [...], "total_nodes", "total_tokens", "shown_nodes"}. `pinned`: id() of the nodes
    prefix pins lock (KVManager), marked on the nodes they end at."""
    root = cache.root
    clock = cache.clock_now()
    # subtree sizes, children before parents (iterative post-order: no recursion limit)
    order: list[TreeNode] = []
    stack = [root]
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(n.children.values())
    size: dict[int, int] = {}
    count: dict[int, int] = {}
    for n in reversed(order):
        s, c = len(n.key), 1
        for ch in n.children.values():
            s += size[id(ch)]
            c += count[id(ch)]
        size[id(n)], count[id(n)] = s, c

    ids: dict[int, int] = {id(root): 0}
    nodes: list[dict[str, Any]] = []

    def entry(n: TreeNode, parent_id: int) -> dict[str, Any]:
        e = {"id": len(ids), "parent": parent_id, "tokens": len(n.key), "subtree_tokens": size[id(n)],
             "subtree_nodes": count[id(n)], "lock": n.lock_ref, "age": clock - n.last_access,
             "pinned": id(n) in pinned, "children": len(n.children), "hidden_nodes": 0, "hidden_tokens": 0}
        if with_ids:
            e["head_ids"] = [t & TOKEN_MASK for t in n.key[:HEAD_IDS]]  # a LoRA adapter's keys: its token ids
        return e

    root_entry = {"id": 0, "parent": None, "tokens": 0, "subtree_tokens": size[id(root)],
                  "subtree_nodes": count[id(root)] - 1, "lock": 0, "age": 0, "pinned": False,
                  "children": len(root.children), "hidden_nodes": 0, "hidden_tokens": 0}
    nodes.append(root_entry)
    by_id = {0: root_entry}
    heap = [(-size[id(ch)], k, ch, 0) for k, ch in enumerate(root.children.values())]
    heapq.heapify(heap)
    tie = len(heap)
    while heap and len(nodes) <= max_nodes:
        _, _, n, pid = heapq.heappop(heap)
        e = entry(n, pid)
        ids[id(n)] = e["id"]
        nodes.append(e)
        by_id[e["id"]] = e
        for ch in n.children.values():
            tie += 1
            heapq.heappush(heap, (-size[id(ch)], tie, ch, e["id"]))
    for _, _, n, pid in heap:  # folded into the parent that is shown
        p = by_id[pid]
        p["hidden_nodes"] += count[id(n)]
        p["hidden_tokens"] += size[id(n)]
    return {"nodes": nodes, "total_nodes": count[id(root)] - 1, "total_tokens": size[id(root)],
            "shown_nodes": len(nodes) - 1}
