"""The tokenizer threads of one model, shared by its requests in turns (:class:`TurnPool`).

A request hands over its work as a list of calls (the batcher's ~8k-character chunks of its texts). A thread that
becomes free takes the next call of the request with the **fewest calls running**, ties going to the request whose
last turn came longest ago (its arrival counts as a turn). So:

* a request alone spreads its chunks over every idle thread (a 100-passage rerank request is tokenized by all of
  them at once, not one chunk after another);
* a request that arrives while others are being tokenized takes the next free thread (it has none running): it
  waits for about the chunks already running, not for whole requests; then requests share the threads evenly;
* no request starves: a waiting request with nothing running loses a tie only to requests that were already there.

The pool's executor never holds more calls than it has threads (a call is handed over only when a thread is free),
so the order above is the order calls start in. The policy is processor sharing over the threads, with a request's
calls as its quanta, as the batcher's :class:`~service.inference.fair_queue.FairQueue` shares inference batches
round-robin across requests.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field


@dataclass(eq=False)
class _Request:
    """One caller's calls and where they stand."""

    calls: list[Callable[[], list]]
    future: asyncio.Future
    turn: int
    parts: list = field(default_factory=list)
    next: int = 0  # the next call to hand over
    running: int = 0  # calls handed over and not finished
    left: int = 0  # calls not finished

    def __post_init__(self) -> None:
        self.parts = [None] * len(self.calls)
        self.left = len(self.calls)


#: the order in which waiting requests get a free thread: fewest calls running, then the oldest turn
_TURN_ORDER = operator.attrgetter("running", "turn")


class TurnPool:
    """``threads`` threads running requests' calls in turns (module docstring).

    Args:
        threads: threads of the pool (>= 1).
        name: their name prefix.
    """

    def __init__(self, threads: int, name: str) -> None:
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self._busy = 0
        self._waiting: list[_Request] = []  # requests with calls not yet handed over
        self._live: set[_Request] = set()  # requests not answered yet
        self._turns = itertools.count()
        self._closed: Callable[[], BaseException] | None = None

    @property
    def waiting(self) -> int:
        """Requests with calls not yet handed to a thread."""
        return len(self._waiting)

    async def run(self, calls: list[Callable[[], list]]) -> list:
        """Run ``calls`` (each returning a list) in turns with other requests' calls; returns their results
        concatenated in the order of ``calls``. Cancelling the caller hands over no more of its calls.

        Raises:
            whatever a call raised (the calls after it are not run), or what :meth:`close`'s ``error`` makes.
        """
        if self._closed is not None:
            raise self._closed()
        if not calls:
            return []
        req = _Request(calls, asyncio.get_running_loop().create_future(), next(self._turns))
        self._waiting.append(req)
        self._live.add(req)
        self._dispatch()
        try:
            parts = await req.future
        finally:
            self._forget(req)
        return [x for part in parts for x in part]

    def close(self, error: Callable[[], BaseException]) -> None:
        """Hand over no more calls; every request not answered yet, and every later one, gets ``error()``. Calls
        running finish in the background and are ignored."""
        self._closed = error
        for req in list(self._live):
            if not req.future.done():
                req.future.set_exception(error())
            self._forget(req)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _forget(self, req: _Request) -> None:
        self._live.discard(req)
        if req in self._waiting:
            self._waiting.remove(req)

    def _dispatch(self) -> None:
        while self._busy < self.threads and self._waiting and self._closed is None:
            req = min(self._waiting, key=_TURN_ORDER)  # O(waiting requests), in C
            i = req.next
            req.next += 1
            req.running += 1
            req.turn = next(self._turns)
            if req.next == len(req.calls):
                self._waiting.remove(req)
            self._busy += 1
            cf: Future = self._pool.submit(req.calls[i])
            cf.add_done_callback(_on_loop(req.future.get_loop(), self._done, req, i))

    def _done(self, req: _Request, i: int, f: Future) -> None:
        self._busy -= 1
        req.running -= 1
        if not req.future.done():
            if f.cancelled():
                req.future.set_exception(self._closed() if self._closed else asyncio.CancelledError())
            elif (err := f.exception()) is not None:
                req.future.set_exception(err)
                self._forget(req)
            else:
                req.parts[i] = f.result()
                req.left -= 1
                if req.left == 0:
                    req.future.set_result(req.parts)
        self._dispatch()


def _on_loop(loop: asyncio.AbstractEventLoop, done: Callable, req: _Request, i: int) -> Callable[[Future], None]:
    """A done-callback of a pool future that calls ``done(req, i, future)`` on ``loop`` (nothing if the loop has
    closed meanwhile: its requests are gone with it)."""

    def callback(f: Future) -> None:
        try:
            loop.call_soon_threadsafe(done, req, i, f)
        except RuntimeError:  # the loop is closed
            pass

    return callback
