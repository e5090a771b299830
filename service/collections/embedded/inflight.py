"""One computation shared by the threads that ask for the same thing at the same time (the "single flight" pattern of
Go's ``golang.org/x/sync/singleflight``): the first caller of a key computes, callers arriving while it runs wait
for its result instead of computing it again, and nothing is kept once it is done (no cache to invalidate).

A collection uses it for the points a filter admits: the prefetches of a hybrid query carry the same filter and run
at the same time, each under the collection's read lock. While any of them holds that lock no write can land, so
every caller that joins a running computation would have read the same ids itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Call(Generic[T]):
    """One running computation: its result or error once ``done`` is set."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None


class InFlight(Generic[T]):
    """Computations in progress by key; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call[T]] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, or the result of the call of ``compute`` for ``key`` already running in another thread.

        Raises:
            Whatever ``compute`` raises (in every caller that waited for it).
        """
        with self._lock:
            call = self._calls.get(key)
            owner = call is None
            if owner:
                call = self._calls[key] = _Call()
        assert call is not None
        if not owner:
            call.done.wait()
            if call.error is not None:
                raise call.error
            return call.result  # type: ignore[return-value]
        try:
            call.result = compute()
            return call.result
        except BaseException as e:
            call.error = e
            raise
        finally:
            with self._lock:
                del self._calls[key]
            call.done.set()
