"""KV tiers under the radix tree (torch-free): page records, their keys, a disk tier (L2), Redis (L3)."""
