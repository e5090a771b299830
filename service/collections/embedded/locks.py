"""Thread locks of the embedded backend: a readers-writer lock and the locks of one collection."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from service.collections.errors import CollectionClosed


class RWLock:
    """A writer-preferring readers-writer lock (threads)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        """Shared access; waits while a writer holds or waits for the lock."""
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        """Exclusive access."""
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class CollectionLocks:
    """The locks of one embedded collection and whether it is closed.

    Searches and reads hold the read side of a :class:`RWLock`; a write holds the write mutex (one write at a time)
    and, while it changes what searches read, the write side.

    Args:
        name: the collection's name (for :class:`~service.collections.errors.CollectionClosed`'s message).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.rw = RWLock()
        self.mutex = threading.Lock()
        self.closed = False

    def check_open(self) -> None:
        """Raises :class:`~service.collections.errors.CollectionClosed` once the collection was closed (deleted)."""
        if self.closed:
            raise CollectionClosed(f"collection {self.name!r} not found (deleted)")

    @contextmanager
    def reading(self) -> Iterator[None]:
        """The read side, on an open collection. Raises CollectionClosed."""
        with self.rw.read():
            self.check_open()
            yield

    @contextmanager
    def writing(self) -> Iterator[None]:
        """The write mutex (no other write, snapshot or maintenance meanwhile), on an open collection. Raises
        CollectionClosed."""
        with self.mutex:
            self.check_open()
            yield

    @contextmanager
    def swapping(self) -> Iterator[None]:
        """The write side: no search runs meanwhile (hold :meth:`writing` first)."""
        with self.rw.write():
            yield

    def close(self, release: Callable[[], None]) -> None:
        """Wait for running operations, mark the collection closed and call ``release`` (under both locks: nothing
        runs beside it). Idempotent: ``release`` runs once."""
        with self.mutex:
            with self.rw.write():
                if self.closed:
                    return
                self.closed = True
                release()
