"""The embedded backend's thread pool, shared by every collection so that none can take it all
(:class:`..shares.Shares`: one collection's work holds at most ``share`` of its threads at once, by default all but
one). Work is started by :func:`..stopping.run_stoppable`: it is told to stop when its request is cancelled (time
budget, client gone).

Whose work it is: a method of an open :class:`~.collection.Collection` (``c.search``, ``c.count_matching``...) or a
:class:`..stopping.CollectionWork` counts against that collection's share; anything else (the registry, files) is not
counted.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.collections.embedded.collection import Collection
from service.collections.shares import Shares, owner_of
from service.collections.stopping import run_stoppable

T = TypeVar("T")


def collection_of(fn: Callable[..., Any]) -> str | None:
    """The name of the collection ``fn`` works for (module docstring), or None."""
    return owner_of(fn, Collection)


class SharedPool:
    """``threads`` worker threads (a :class:`ThreadPoolExecutor` made with ``pool_kw``), each collection's work holding
    at most ``share`` of them at once (default ``threads - 1``, at least 1)."""

    def __init__(self, threads: int, share: int | None = None, **pool_kw: Any) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, **pool_kw)
        self.shares = Shares(threads, share)
        self.share = self.shares.share

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """``fn(*args, **kw)`` on a worker thread, once its collection holds fewer than ``share`` threads; stopped
        when the awaiting coroutine is cancelled (:func:`..stopping.run_stoppable`)."""
        async with self.shares.gate(collection_of(fn)):
            return await run_stoppable(self.executor, fn, *args, **kw)

    def shutdown(self, wait: bool = True) -> None:
        """Stop the threads (after the queued work, when ``wait``)."""
        self.executor.shutdown(wait=wait)
