"""Request-table rows (torch-free): row r of `req_to_token` belongs to at most one running request."""

from __future__ import annotations


class TableManager:
    def __init__(self, num_rows: int):
        self.num_rows = num_rows
        self._free = list(range(num_rows - 1, -1, -1))  # pop() hands out row 0 first

    @property
    def available(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError("no free request-table row")
        return self._free.pop()

    def free(self, row: int) -> None:
        self._free.append(row)

    def check_integrity(self, rows_in_use: int) -> None:
        if len(set(self._free)) != len(self._free) or len(self._free) + rows_in_use != self.num_rows:
            raise AssertionError(f"table rows: free {len(self._free)} + in use {rows_in_use} != {self.num_rows}")
