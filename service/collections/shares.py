"""Each collection's share of a backend's worker threads: one collection's work holds at most ``share`` of them at
once (by default all but one), the rest of its work waiting on the event loop (holding no thread), so a trivial read
of another collection always finds a thread even while one collection runs heavy queries on all the others. Both
backends bound their pools so (:mod:`.embedded.pool`, :meth:`.milvus.backend.MilvusBackend.run`), and start work
through :func:`.stopping.run_stoppable` so that it is told to stop with its request.

Whose work it is: a method of an open collection handle (``c.search``, ``c.count_matching``...) or a
:class:`.stopping.CollectionWork` counts against that collection's share; anything else (the registry, files) is not
counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from service.collections.stopping import CollectionWork


def owner_of(fn: Callable[..., Any], handle_type: type) -> str | None:
    """The name of the collection ``fn`` works for: a :class:`~.stopping.CollectionWork`'s, or the ``name`` of the
    ``handle_type`` instance ``fn`` is a bound method of; None for any other work."""
    if isinstance(fn, CollectionWork):
        return fn.collection
    owner = getattr(fn, "__self__", None)
    return owner.name if isinstance(owner, handle_type) else None


class Shares:
    """The per-collection gates of a pool of ``threads`` threads, each letting ``share`` pieces of one collection's
    work hold a thread at once (default ``threads - 1``, at least 1)."""

    def __init__(self, threads: int, share: int | None = None) -> None:
        self.share = max(1, share if share is not None else threads - 1)
        self._gates: dict[str, asyncio.Semaphore] = {}

    def gate(self, collection: str | None) -> contextlib.AbstractAsyncContextManager[Any]:
        """What a piece of work for ``collection`` holds while it holds a thread (None: work of no collection,
        never held back)."""
        if collection is None:
            return contextlib.nullcontext()
        gate = self._gates.get(collection)
        if gate is None:
            gate = self._gates[collection] = asyncio.Semaphore(self.share)
        return gate
