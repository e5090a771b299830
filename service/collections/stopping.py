"""Stopping blocking work whose request is gone: work handed to a thread pool keeps running after the coroutine
awaiting it is cancelled (asyncio cancels the wait, not the thread), so a request stopped at its time budget
(``request_timeout_s``) or by its client's disconnect would go on spending CPU for nobody.

:func:`run_stoppable` runs a function on an executor under a :class:`Stop` flag (a context variable, so the flag
follows the work into its thread); the flag is raised when the awaiting coroutine is cancelled. Long loops call
:func:`check` (it raises :class:`WorkStopped` once the flag is up), SQL functions written in Python look at
:func:`stop_requested` on each row, and :func:`interrupt_reads` makes a SQLite connection abort a running read
statement then (SQLite's progress handler, "interrupted"; a statement inside a write transaction is never
interrupted). Without a flag (work not started by :func:`run_stoppable`) none of them does anything.

:class:`CollectionWork` marks CPU work done for one collection (MMR selection, formula scoring, an order scan), so
that a pool bounding each collection's share of its threads counts it (:mod:`.embedded.pool`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sqlite3
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from service.collections.errors import CollectionError

T = TypeVar("T")
CHECK_EVERY = 16  # iterations of a Python loop between two checks (:func:`every`)
PROGRESS_STEPS = 100_000  # SQLite steps between two looks at the flag (a few ms of SQL: each look takes the GIL)


class WorkStopped(CollectionError):
    """The request's work was stopped: its client left or its time budget (``request_timeout_s``) ran out."""


class Stop:
    """The flag of one piece of work: ``stopped`` is set once nobody waits for its result."""

    __slots__ = ("stopped",)

    def __init__(self) -> None:
        self.stopped = False


_current: contextvars.ContextVar[Stop | None] = contextvars.ContextVar("collections_stop", default=None)


def stop_requested() -> bool:
    """Whether the work running in this context was told to stop."""
    s = _current.get()
    return s is not None and s.stopped


def check() -> None:
    """Raise :class:`WorkStopped` if the work running in this context was told to stop."""
    if stop_requested():
        raise WorkStopped("the request was stopped (its client left, or it ran past request_timeout_s)")


def every(i: int) -> None:
    """:func:`check` once every :data:`CHECK_EVERY` values of a loop counter ``i`` (cheap enough for inner loops)."""
    if i % CHECK_EVERY == 0:
        check()


def interrupt_reads(conn: sqlite3.Connection) -> None:
    """Make ``conn`` abort a statement (``sqlite3.OperationalError: interrupted``) once the work running it is told
    to stop, every :data:`PROGRESS_STEPS` steps; never inside a transaction (a write runs to its end)."""

    def handler() -> int:
        return int(stop_requested() and not conn.in_transaction)

    conn.set_progress_handler(handler, PROGRESS_STEPS)


async def run_stoppable(executor: Executor, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    """``fn(*args, **kw)`` on ``executor``, under a fresh :class:`Stop` that is raised if this coroutine is cancelled
    (the work then stops at its next :func:`check` or SQLite progress step; its result or error is dropped)."""
    stop = Stop()
    ctx = contextvars.copy_context()
    ctx.run(_current.set, stop)
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(executor, functools.partial(ctx.run, fn, *args, **kw))
    except asyncio.CancelledError:
        stop.stopped = True
        raise


@dataclass
class CollectionWork(Generic[T]):
    """Blocking work ``fn()`` done for the collection named ``collection`` (a pool counts it against that
    collection's share of its threads)."""

    collection: str
    fn: Callable[[], T]

    def __call__(self) -> T:
        """Run ``fn``."""
        return self.fn()


def for_collection(collection: str, fn: Callable[..., T], *args: Any, **kw: Any) -> CollectionWork[T]:
    """A :class:`CollectionWork` of ``fn(*args, **kw)`` for ``collection``."""
    return CollectionWork(collection, functools.partial(fn, *args, **kw))
