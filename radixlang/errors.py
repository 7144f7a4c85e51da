"""Exceptions the frontend raises, and the message for a missing optional dependency."""

from __future__ import annotations


class ProgramError(RuntimeError):
    """A program state failed (a backend error, a refused request, a lost connection): raised by
    `s[v]` for a variable that will never be set; `state.error()` returns the cause."""


class BackendError(RuntimeError):
    """A backend answered with an error. `status` is the HTTP-style code (400 refused, 401 bad key,
    503 runtime gone, 0 transport failure)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class UnreachableError(BackendError, ConnectionError):
    """Nothing answers at the backend's address (connection refused, unknown host, no route, no TCP
    connection within the connect timeout): raised at once, the message names the address."""


def missing_extra(package: str, extra: str) -> ImportError:
    return ImportError(f"this needs the '{package}' package: pip install 'radixlang[{extra}]' "
                       f"(or pip install {package})")
