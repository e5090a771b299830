"""Work that must complete once begun, whatever its caller does: a collection's create or delete, a snapshot, a
recovery. The caller awaits it shielded (``asyncio.shield``): cancelling the caller (a client that left, a request's
time budget) stops the wait, never the work, which runs to its end as a task of its own; a failure after the caller
left is logged."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("service.collections")
_running: set[asyncio.Future] = set()  # strong references: a task nobody awaits any more is not collected
_orphans: set[asyncio.Future] = set()  # those whose caller left: their failure is logged, nobody else sees it


def _done(task: asyncio.Future) -> None:
    _running.discard(task)
    if task in _orphans:
        _orphans.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("an operation that outlived its request failed: %s", task.exception(), exc_info=task.exception())


async def to_completion(coro: Awaitable[T]) -> T:
    """The result of ``coro``, run as a task that cancelling the caller does not stop (what it raises, raised)."""
    task = asyncio.ensure_future(coro)
    _running.add(task)
    task.add_done_callback(_done)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            _orphans.add(task)
        raise
