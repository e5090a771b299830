"""One computation shared by the threads that ask for the same thing at the same time (the "single flight" pattern of
Go's ``golang.org/x/sync/singleflight``): the first caller of a key computes, callers arriving while it runs wait
for its result instead of computing it again, and nothing is kept once it is done (no cache to invalidate). A
computation that fails is not shared: its error may be its caller's own (a request stopped at its deadline or by its
client, :mod:`..stopping`), so each waiting caller then computes for itself. A waiting caller whose own request is
stopped stops waiting (:func:`..stopping.check`).

A collection uses it for the points a filter admits: the prefetches of a hybrid query carry the same filter and run
at the same time, each under the collection's read lock. While any of them holds that lock no write can land, so
every caller that joins a running computation would have read the same ids itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from service.collections.stopping import check

T = TypeVar("T")
_WAIT_SLICE_S = 0.05  # a waiting caller looks at its own stop flag this often


class _Call(Generic[T]):
    """One running computation: its result, or whether it failed, once ``done`` is set."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: T | None = None
        self.failed = False


class InFlight(Generic[T]):
    """Computations in progress by key; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call[T]] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, or the result of the call of ``compute`` for ``key`` already running in another thread
        (computed here after all when that call fails).

        Raises:
            WorkStopped: this caller's work was stopped while it waited.
            Whatever ``compute`` raises when this caller runs it.
        """
        while True:
            with self._lock:
                call = self._calls.get(key)
                owner = call is None
                if owner:
                    call = self._calls[key] = _Call()
            assert call is not None
            if owner:
                break
            while not call.done.wait(_WAIT_SLICE_S):
                check()
            if not call.failed:
                return call.result  # type: ignore[return-value]
        try:
            call.result = compute()
            return call.result
        except BaseException:
            call.failed = True
            raise
        finally:
            with self._lock:
                del self._calls[key]
            call.done.set()
