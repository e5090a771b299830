"""The embedded backend's thread pool, shared by every collection so that none can take it all: one collection's
work holds at most ``share`` of its threads at once (by default all but one), the rest of its work waiting on the
event loop (holding no thread), so a trivial read of another collection always finds a thread even while one
collection runs heavy queries on all the others. Work is started by :func:`..stopping.run_stoppable`: it is told to
stop when its request is cancelled (time budget, client gone).

Whose work it is: a method of an open :class:`~.collection.Collection` (``c.search``, ``c.count_matching``...) or a
:class:`..stopping.CollectionWork` counts against that collection's share; anything else (the registry, files) is not
counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.collections.embedded.collection import Collection
from service.collections.stopping import CollectionWork, run_stoppable

T = TypeVar("T")


def collection_of(fn: Callable[..., Any]) -> str | None:
    """The name of the collection ``fn`` works for (module docstring), or None."""
    if isinstance(fn, CollectionWork):
        return fn.collection
    owner = getattr(fn, "__self__", None)
    return owner.name if isinstance(owner, Collection) else None


class SharedPool:
    """``threads`` worker threads (a :class:`ThreadPoolExecutor` made with ``pool_kw``), each collection's work holding
    at most ``share`` of them at once (default ``threads - 1``, at least 1)."""

    def __init__(self, threads: int, share: int | None = None, **pool_kw: Any) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, **pool_kw)
        self.share = max(1, share if share is not None else threads - 1)
        self._gates: dict[str, asyncio.Semaphore] = {}

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """``fn(*args, **kw)`` on a worker thread, once its collection holds fewer than ``share`` threads; stopped
        when the awaiting coroutine is cancelled (:func:`..stopping.run_stoppable`)."""
        key = collection_of(fn)
        if key is None:
            return await run_stoppable(self.executor, fn, *args, **kw)
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = asyncio.Semaphore(self.share)
        async with gate:
            return await run_stoppable(self.executor, fn, *args, **kw)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the threads (after the queued work, when ``wait``)."""
        self.executor.shutdown(wait=wait)
