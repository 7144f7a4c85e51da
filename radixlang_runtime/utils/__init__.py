"""Small mechanisms shared by several packages: child processes, liveness clocks, fault injection, restart budgets,
rate limits, link keys, memory release (torch-free)."""
