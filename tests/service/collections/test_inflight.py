"""A filter's admitted ids computed once for the searches that ask at the same time (``embedded.inflight``): callers
that arrive while it runs share the result (or the error); nothing is kept after, so a later call computes again."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.embedded.inflight import InFlight
from service.collections.filters import parse_filter
from service.collections.index import IndexSpec, normalize_params
from service.collections.schema import VectorsConfig
from service.collections.stopping import WorkStopped, run_stoppable

D = 8


def test_concurrent_callers_share_one_computation_and_nothing_is_kept():
    flight: InFlight[int] = InFlight()
    started, release, calls = threading.Event(), threading.Event(), []

    def slow() -> int:
        calls.append(1)
        started.set()
        release.wait(5)
        return len(calls)

    with ThreadPoolExecutor(5) as pool:  # the owner, 3 waiters and the other key each hold a thread
        first = pool.submit(flight.get, "k", slow)
        assert started.wait(5)
        joined = [pool.submit(flight.get, "k", slow) for _ in range(3)]
        other = pool.submit(flight.get, "other", lambda: -1)  # another key is not held up
        assert other.result(5) == -1
        release.set()
        assert [f.result(5) for f in (first, *joined)] == [1, 1, 1, 1]
    assert len(calls) == 1
    assert flight.get("k", lambda: 7) == 7  # done calls are forgotten: computed again


def test_a_failed_computation_is_not_shared_the_waiting_caller_computes_its_own():
    """The owner's error may be its own (its request stopped at its deadline): a caller that waited computes for
    itself, and the error reaches only the owner."""
    flight: InFlight[int] = InFlight()
    started, release = threading.Event(), threading.Event()

    def stopped() -> int:
        started.set()
        release.wait(5)
        raise WorkStopped("the request's time budget ran out")

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(flight.get, "k", stopped)
        assert started.wait(5)
        second = pool.submit(flight.get, "k", lambda: 1)
        release.set()
        with pytest.raises(WorkStopped):
            first.result(5)
        assert second.result(5) == 1
    assert flight.get("k", lambda: 2) == 2


def test_a_waiting_caller_stops_with_its_own_request():
    """A caller waiting on another's computation gives up when its own work is stopped, not when that one ends."""
    flight: InFlight[int] = InFlight()
    started, release = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        release.wait(5)
        return 1

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(2) as pool:
            first = loop.run_in_executor(pool, flight.get, "k", slow)
            assert await asyncio.to_thread(started.wait, 5)
            waiter = asyncio.ensure_future(run_stoppable(pool, flight.get, "k", lambda: 2))
            await asyncio.sleep(0.2)
            waiter.cancel()  # its request stopped: the thread sees the flag within a wait slice
            with pytest.raises(asyncio.CancelledError):
                await waiter
            # the waiter's thread is free again while the first computation still runs (2 threads in the pool)
            assert await asyncio.wait_for(loop.run_in_executor(pool, lambda: 3), 2) == 3
            release.set()
            assert await first == 1

    asyncio.run(main())


def test_concurrent_filtered_searches_answer_as_one_at_a_time(tmp_path):
    """Searches with the same filter from many threads, with writes between rounds: each answer is the one the
    search gives alone after the same writes (a shared computation never hands out ids from before a write)."""
    rng = np.random.default_rng(0)
    spec = IndexSpec("flat", "cosine", normalize_params("flat", {}, D), D)
    c = Collection.create(tmp_path / "c", VectorsConfig.single(spec, {"name": "m", "version": "1", "sha256": "0" * 64}))
    where = parse_filter({"g": {"$in": [1, 2]}})
    q = rng.standard_normal((1, D)).astype(np.float32)
    with ThreadPoolExecutor(4) as pool:
        for step in range(5):
            ids = list(range(step * 40, step * 40 + 60))  # replaces 20 points, adds 40
            c.upsert(
                ids,
                ["t"] * len(ids),
                [{"g": (i + step) % 4} for i in ids],
                rng.standard_normal((60, D)).astype(np.float32),
            )
            alone = [h.id for h in c.search(q, 10, where, with_text=False, with_payload=False)[0]]
            together = pool.map(
                lambda _: [h.id for h in c.search(q, 10, where, with_text=False, with_payload=False)[0]], range(8)
            )
            assert all(got == alone for got in together)
    c.close()
