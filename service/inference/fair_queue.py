"""Which inputs form the next inference batch: round-robin across requests, length-sorted cuts.

Text Embeddings Inference's queue (``core/src/queue.rs``, ``next_batch``) forms one batch each time the backend
is free, skips requests whose client went away, and takes entries first-in first-out within the token budget.
:class:`FairQueue` keeps the first two and replaces FIFO by **round-robin across requests** (one queue per source,
served in turn: Nagle's fair queueing, RFC 970, here with one batch as the quantum), so a request never waits behind
all the batches of one that came before it, and a small request does not wait for a round of them either:

* a request that fits in one batch (at most ``max_batch_size`` inputs and ``max_batch_tokens`` padded tokens) takes
  a priority lane, served first come, first served, leading every other batch at most while the ring has work; any
  other request joins the back of a ring whose requests lead a batch in turn, then go to the back again. The
  request whose turn it is *leads* the next batch; a request's inputs are taken shortest first;
* a window of placeable inputs is filled round-robin, the lead first (``max_batch_size`` per request per round, up
  to ``max(256, 4 x max_batch_size)`` inputs), sorted by token length and cut by :func:`cut_window` into
  contiguous batches within ``max_batch_size`` inputs and ``max_batch_tokens`` padded tokens (``batch x
  max_len``), at the cut points minimising ``sum(padded tokens) + overhead x n_batches`` (dynamic
  programming: a long input does not drag short ones up to its length, and equal lengths share a batch);
* the batch holding the lead's shortest unplaced input is the next batch. Inputs of other requests in that batch
  ride along without spending their turn. The cut is kept as a plan and reused while the next lead's input is in
  it, so the dynamic programme runs about once per window, and again for each newcomer;
* no starvation: each turn places at least one input of its lead, so a request of ``n`` inputs is done within
  ``n`` turns; a one-batch request waits for the batch running and, when the one before was also led from the
  priority lane, one batch of the ring (a one-sentence request behind eight 512-input requests: one or two
  batches, not eight more), plus one per one-batch request ahead of it; the ring gets every other batch at least,
  and a request in it waits one batch per request ahead of it in the ring.

Everything here runs on the event loop and never blocks (no inference, no I/O).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from service.inference.text_tokenizer import Tokenized

#: Smallest window of inputs sorted together (more inputs sorted = less padding).
WINDOW_MIN = 256


@dataclass(eq=False)
class Job:
    """One request in the batcher: its tokens, output rows, and which inputs are already in a batch.

    ``out`` is float32 ``(n, dimension)`` (pooled, unnormalised rows, written as batches finish); ``remaining``
    counts rows not yet written; ``failed`` marks a request that is cancelled or failed (skipped from then on).
    """

    tokens: Tokenized
    future: asyncio.Future | None
    out: np.ndarray | None
    remaining: int
    failed: bool = False
    order: list[int] = field(init=False, repr=False)  # input indices, shortest first (stable)
    placed: np.ndarray = field(init=False, repr=False)  # (n,) bool: in a batch already
    unplaced: int = field(init=False)
    cursor: int = field(init=False, default=0)  # order[:cursor] are all placed

    def __post_init__(self) -> None:
        self.order = np.argsort(self.tokens.lengths, kind="stable").tolist()
        self.placed = np.zeros(len(self.order), dtype=bool)
        self.unplaced = len(self.order)

    @property
    def n(self) -> int:
        """Number of inputs."""
        return len(self.tokens.ids)

    @property
    def live(self) -> bool:
        """Still wanted (not failed, not cancelled or answered) and with inputs left to place."""
        return self.unplaced > 0 and not self.failed and not (self.future is not None and self.future.done())

    def next_unplaced(self, k: int) -> list[int]:
        """Up to ``k`` unplaced input indices, shortest first."""
        while self.cursor < len(self.order) and self.placed[self.order[self.cursor]]:
            self.cursor += 1
        got: list[int] = []
        for i in self.order[self.cursor :]:
            if len(got) >= k:
                break
            if not self.placed[i]:
                got.append(i)
        return got

    def place(self, i: int) -> None:
        """Mark input ``i`` as taken into a batch."""
        self.placed[i] = True
        self.unplaced -= 1


Item = tuple[Job, int]  # (request, index of one of its inputs)


def cut_window(window: list[Item], *, max_batch_size: int, max_batch_tokens: int, overhead: int) -> list[list[Item]]:
    """Sort ``window`` by token length (in place); cut it into batches minimising padded tokens + ``overhead``
    per batch.

    Batches are contiguous runs of the sorted window, each within ``max_batch_size`` inputs and
    ``max_batch_tokens`` padded tokens (a single input may exceed the latter). Returned shortest first.

    The dynamic programme ``best[e] = min_s best[s] + (e - s) x len[e - 1] + overhead`` runs over the few cut points
    an optimal cut needs: some optimal cut ends every batch at the end of a run of equal lengths or *full* (as many
    inputs as its last length allows). Exchange argument: a batch that ends inside a run and is not full can take
    the next input (same length, so its padded length is unchanged) from the batch after it, which pays at least as
    much per input; repeat. So the cut points are 0, the run ends, and the ends of full batches from cut points
    (:func:`_cut_points`); at most a few hundred for a window of 1,024 STS-B inputs, and ``n / max_batch_size`` +
    2 when all lengths are equal. Cost: ``O(points x max_batch_size)`` numpy work, on the event loop once per window
    (``bench/cut_bench.py``: 0.8 ms for 1,024 STS-B inputs and batches of 256, 7.6 ms for the programme over every
    position it replaces).
    """
    if not window:
        return []
    window.sort(key=lambda ji: len(ji[0].tokens.ids[ji[1]]))
    lengths = np.fromiter((len(j.tokens.ids[i]) for j, i in window), dtype=np.int64, count=len(window))
    cap = np.minimum(max_batch_size, np.maximum(1, max_batch_tokens // lengths))  # most inputs ending at this one
    points = _cut_points(lengths, cap, max_batch_size)
    at = np.asarray(points, dtype=np.int64)
    best = np.zeros(len(points), dtype=np.float64)
    start = np.zeros(len(points), dtype=np.int64)  # index into points of the best batch start
    for k in range(1, len(points)):
        end = points[k]
        lo = int(np.searchsorted(at[:k], end - cap[end - 1]))  # batches of at most cap[end - 1] inputs
        cost = best[lo:k] + (end - at[lo:k]) * lengths[end - 1] + overhead
        j = int(np.argmin(cost))
        best[k], start[k] = cost[j], lo + j
    cuts = []
    k = len(points) - 1
    while k > 0:
        cuts.append((points[start[k]], points[k]))
        k = int(start[k])
    return [window[a:b] for a, b in reversed(cuts)]


def _cut_points(lengths: np.ndarray, cap: np.ndarray, max_batch_size: int) -> list[int]:
    """Sorted cut points for :func:`cut_window`: 0, every run end of the sorted ``lengths`` (n,), and, from each
    point ``b``, the end ``e`` of the full batch starting there (``e - b == cap[e - 1]``; at most one, as ``e - b``
    grows and ``cap``, by length, shrinks)."""
    n = len(lengths)
    points = {0, n, *(np.flatnonzero(np.diff(lengths)) + 1).tolist()}
    todo = list(points)
    while todo:
        b = todo.pop()
        hi = min(n, b + max_batch_size)
        full = np.flatnonzero(np.arange(1, hi - b + 1) == cap[b:hi])
        if len(full) and (e := b + 1 + int(full[0])) not in points:
            points.add(e)
            todo.append(e)
    return sorted(points)


class FairQueue:
    """The requests with inputs to place, and the batch-forming policy of the module docstring.

    Args: the batcher's ``max_batch_size``, ``max_batch_tokens`` (padded) and ``overhead`` (padded-token
    equivalents per batch).
    """

    def __init__(self, *, max_batch_size: int, max_batch_tokens: int, overhead: int) -> None:
        self.max_batch_size, self.max_batch_tokens, self.overhead = max_batch_size, max_batch_tokens, overhead
        self.fresh: deque[Job] = deque()  # requests that fit in one batch, not served yet (first come, first served)
        self.ring: deque[Job] = deque()  # had a turn: round-robin
        self._plan: dict[Item, list[Item]] = {}  # item -> its batch in the last cut of a window
        self._newcomer_led = False  # whether the last batch was led from the priority lane

    def add(self, job: Job) -> None:
        """A new request: one that fits in one batch takes the priority lane, any other joins the back of the ring."""
        fits = job.n <= self.max_batch_size and job.n * int(job.tokens.lengths.max()) <= self.max_batch_tokens
        (self.fresh if fits else self.ring).append(job)

    def has_work(self) -> bool:
        """Some request still has inputs to place."""
        return any(j.live for j in self.fresh) or any(j.live for j in self.ring)

    def clear(self) -> list[Job]:
        """Empty the queue; returns the requests it held."""
        jobs = [*self.fresh, *self.ring]
        self.fresh.clear()
        self.ring.clear()
        self._plan.clear()
        return jobs

    def drop_lead(self) -> Job | None:
        """Remove and return the request that leads the next batch (after an error forming its batch)."""
        self._plan.clear()
        for q in (self.fresh, self.ring):
            if q:
                return q.popleft()
        return None

    def cut(self, window: list[Item]) -> list[list[Item]]:
        """:func:`cut_window` with this queue's limits."""
        return cut_window(
            window, max_batch_size=self.max_batch_size, max_batch_tokens=self.max_batch_tokens, overhead=self.overhead
        )

    def window(self, jobs: list[Job] | None = None) -> list[Item]:
        """Placeable inputs of ``jobs`` (default: newcomers, then the ring), ``max_batch_size`` per request per
        round-robin round, up to the window size."""
        room = max(WINDOW_MIN, 4 * self.max_batch_size)
        take = dict.fromkeys(jobs if jobs is not None else [*self.fresh, *self.ring], 0)
        while room > 0:
            before = room
            for job in take:
                k = min(self.max_batch_size, job.unplaced - take[job], room)
                if k > 0:
                    take[job] += k
                    room -= k
                    if room == 0:
                        break
            if room == before:
                break
        return [(job, i) for job, k in take.items() if k for i in job.next_unplaced(k)]

    def next_batch(self) -> list[Item]:
        """The next batch, its inputs marked placed; [] when nothing is left to place."""
        self.fresh = deque(j for j in self.fresh if j.live)
        self.ring = deque(j for j in self.ring if j.live)
        if not self.fresh and not self.ring:
            self._plan.clear()
            return []
        # one-batch requests first (in arrival order), but every other batch at most while the ring has work: a
        # stream of them cannot starve the ring
        self._newcomer_led = bool(self.fresh) and not (self._newcomer_led and self.ring)
        lead = self.fresh.popleft() if self._newcomer_led else self.ring.popleft()
        key = (lead, lead.next_unplaced(1)[0])
        batch = self._plan.get(key)
        if batch is None:  # a newcomer (or a window used up): cut a new window, the lead first
            self._plan = {item: b for b in self.cut(self.window([lead, *self.fresh, *self.ring])) for item in b}
            batch = self._plan[key]
        for job, i in batch:
            del self._plan[(job, i)]
            job.place(i)
        self.ring.append(lead)  # the lead's turn is over: to the back of the ring
        return [(j, i) for j, i in batch if not j.failed]
