"""Dynamic batching for one model: one worker forms one batch at a time, fairly across requests.

Flow of a request (:meth:`Batcher.submit`):

1. admission: more than ``max_queue_size`` requests admitted and unanswered → :class:`QueueFull`;
2. tokenization in a thread pool, in chunks of ~8k characters taken in turns across requests (a lone request's
   chunks spread over every idle thread; :mod:`service.inference.tokenizer_turns`) (``truncate=False`` and an input
   over ``max_seq_length`` →
   :class:`InputTooLong`; more than ``max_request_tokens`` tokens in all → :class:`RequestTooLarge`; nothing
   is queued);
3. the request joins the batcher's :class:`~service.inference.fair_queue.FairQueue`; each time an inference worker is
   free, the worker forms **one** batch from it: round-robin across requests, each request's inputs shortest
   first, windows sorted by length and cut within ``max_batch_tokens`` / ``max_batch_size`` (the policy, and
   how it follows and departs from Text Embeddings Inference's queue, is in :mod:`service.inference.fair_queue`). A new
   request so waits for the batches already running and about one batch per request ahead of it, never for all
   the batches of a big request;
4. the batch is padded to its own longest input and run by ONNX Runtime in an executor of
   ``inference_workers`` threads (the event loop never waits on it); rows are scattered back into each
   request's output array, and its future resolves when all its rows are in.

A failing batch fails only the requests that had inputs in it; the worker goes on. A cancelled request
(disconnect, time budget) is skipped: nothing more of it is placed in a batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from service.inference.batch_errors import BatcherClosed, BatchFailed, InputTooLong, QueueFull, RequestTooLarge
from service.inference.fair_queue import FairQueue, Item, cut_window
from service.inference.fair_queue import Job as _Job
from service.inference.onnx_encoder import OnnxModel
from service.inference.text_tokenizer import Tokenized
from service.inference.tokenizer_turns import TurnPool
from service.metrics import Metrics
from service.tasks import cancel_and_wait

log = logging.getLogger("service.inference.batcher")

#: characters per tokenizer call (a request's texts are tokenized in chunks of about this size, in turns)
TOKENIZE_CHUNK_CHARS = 8192


@dataclass
class SubmitResult:
    """A request's pooled (unnormalised) float32 ``(n, dimension)`` output and its token counts (n,)."""

    pooled: np.ndarray
    lengths: np.ndarray = field(repr=False)

    @property
    def prompt_tokens(self) -> int:
        """Tokens of all inputs, after truncation and with special tokens (OpenAI ``usage.prompt_tokens``)."""
        return int(self.lengths.sum())


class Batcher:
    """Queue + worker for one :class:`OnnxModel` (policy: see the module docstring).

    Args:
        model: the loaded model.
        metrics: where to record queue size, batch sizes and durations.
        max_batch_tokens: budget of padded tokens (``batch x max_len``) per batch.
        max_batch_size: most inputs per batch.
        max_queue_size: most requests admitted and not yet answered.
        tokenizer_threads: threads tokenizing requests.
        inference_workers: batches run concurrently (threads calling the ORT session).
        batch_overhead_tokens: fixed cost of one batch, in padded-token equivalents, used to cut windows.
        max_request_tokens: most tokens (after truncation) in one request; None: no limit.
    """

    def __init__(
        self,
        model: OnnxModel,
        metrics: Metrics,
        *,
        max_batch_tokens: int,
        max_batch_size: int,
        max_queue_size: int,
        tokenizer_threads: int = 2,
        inference_workers: int = 1,
        batch_overhead_tokens: int = 64,
        max_request_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self.batch_overhead_tokens = batch_overhead_tokens
        self.max_request_tokens = max_request_tokens
        self._label = model.info.id
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()  # submitted, not yet in the fair queue
        self._fair = FairQueue(
            max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens, overhead=batch_overhead_tokens
        )
        self._admitted = 0
        self._closing = False
        self._closed = False  # the worker and the pools are gone: nothing admitted may be queued any more
        self._worker: asyncio.Task | None = None
        self._tok_pool = TurnPool(tokenizer_threads, f"tok-{model.info.name}")
        self._infer_pool = ThreadPoolExecutor(inference_workers, thread_name_prefix=f"infer-{model.info.name}")
        self._slots = asyncio.Semaphore(inference_workers)
        self._running: set[asyncio.Task] = set()
        self._g_queue = metrics.queue_size.labels(self._label)
        self._g_queue.set(0)

    # ------------------------------------------------------------------ public
    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet answered."""
        return self._admitted

    def start(self) -> None:
        """Start the worker task (call from the running event loop)."""
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name=f"batcher-{self._label}")

    async def submit(
        self, texts: list[str], *, truncate: bool = True, direction: str = "right", ids: list[np.ndarray] | None = None
    ) -> SubmitResult:
        """Run ``texts`` (strings; a reranker's: (query, passage) pairs); returns the graph's rows in input order.
        ``direction``: which end of an over-long input is cut (:meth:`OnnxModel.tokenize`). ``ids``: the texts' token
        ids already made by this model's tokenizer with the same ``truncate`` and ``direction`` (a front process's,
        ``service.front.tokenizing``), one int64 array per text: used as they are, not tokenized again.

        Raises:
            QueueFull: ``max_queue_size`` requests are already waiting (answer 429).
            InputTooLong: ``truncate=False`` and an input exceeds ``max_seq_length`` tokens (answer 413).
            RequestTooLarge: more than ``max_request_tokens`` tokens in all (answer 413).
            BatchFailed: inference failed for a batch with some of these inputs (answer 500).
            BatcherClosed: shutting down (answer 503).
        """
        if self._closing:
            raise BatcherClosed("model is shutting down")
        if self._admitted >= self.max_queue_size:
            self.metrics.rejected.labels(self._label, "queue_full").inc()
            raise QueueFull(f"{self._admitted} requests queued (max_queue_size={self.max_queue_size})")
        self._admitted += 1
        self._g_queue.set(self._admitted)
        try:
            loop = asyncio.get_running_loop()
            tokens = Tokenized(ids) if ids is not None else await self._tokenize_fairly(texts, truncate, direction)
            self._check(tokens, texts, truncate)
            job = _Job(
                tokens,
                loop.create_future(),
                np.empty((len(texts), self.model.info.dimension), np.float32),
                remaining=len(texts),
            )
            self._queue.put_nowait(job)
            try:
                out = await job.future
            except asyncio.CancelledError:
                job.failed = True  # no more of its inputs are placed in a batch
                raise
            return SubmitResult(out, tokens.lengths)
        finally:
            self._admitted -= 1
            self._g_queue.set(self._admitted)

    async def close(self, timeout: float = 30.0) -> None:
        """Stop admitting, let queued work finish (up to ``timeout`` s), stop the worker and thread pools; every request
        not answered by then (queued, in a batch, or still tokenizing) gets :class:`BatcherClosed`."""
        self._closing = True
        deadline = time.monotonic() + timeout
        while self._admitted > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await cancel_and_wait(self._worker)
        self._worker = None
        for t in list(self._running):
            t.cancel()
        self._closed = True
        for job in self._fair.clear() + _drain(self._queue):
            if job.future is not None and not job.future.done():
                job.future.set_exception(BatcherClosed("model is shutting down"))
        # requests still tokenizing are answered now; the chunks running finish in the background, ignored
        self._tok_pool.close(lambda: BatcherClosed("model is shutting down"))
        self._infer_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ requests
    async def _tokenize_fairly(self, texts: list[str], truncate: bool, direction: str = "right") -> Tokenized:
        """Token ids of ``texts`` (:meth:`OnnxModel.tokenize`), made by :meth:`_in_turns`.

        Raises:
            BatcherClosed: close() gave up waiting before this request was tokenized.
        """
        return Tokenized(await self._in_turns(texts, self.model.char_budget, self._tokenize, truncate, direction))

    async def encodings(self, texts: list[str], add_special_tokens: bool = True) -> list:
        """The tokenizer's untruncated ``tokenizers.Encoding`` of each of ``texts`` (ids, tokens, character offsets,
        special-token mask), made by :meth:`_in_turns`: what TEI's ``/tokenize`` shows.

        Raises:
            BatcherClosed: shutting down.
            RequestTooLarge: more than ``max_request_tokens`` tokens in all (the answer would be ~60 bytes a token).
        """
        if self._closing:
            raise BatcherClosed("model is shutting down")
        encs = await self._in_turns(texts, None, self.model.encodings, add_special_tokens)
        self._check_total(sum(len(e.ids) for e in encs))
        return encs

    async def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """:meth:`OnnxModel.decode` in the tokenizer pool (TEI's ``/decode``).

        Raises:
            BatcherClosed: shutting down.
        """
        if self._closing:
            raise BatcherClosed("model is shutting down")
        return await self._tok_pool.run([partial(self.model.decode, ids, skip_special_tokens)])

    async def _in_turns(self, texts: list[str], budget: int | None, fn, *args) -> list:
        """``fn(chunk, *args)`` (a list per text) over chunks of ``texts`` of about :data:`TOKENIZE_CHUNK_CHARS`
        characters (a text counted up to ``budget``, the characters the tokenizer reads of it), run by the tokenizer
        threads in turns with other requests' chunks (:class:`~service.inference.tokenizer_turns.TurnPool`): a lone
        request's chunks run on every idle thread at once; a one-sentence request waits for about the chunks already
        running, not for whole 2 MB requests (as batches are formed round-robin). The chunks' results are
        concatenated in order: what one ``fn(texts, *args)`` call gives.

        Raises:
            BatcherClosed: close() gave up waiting before this request was done.
        """
        calls = []
        start = 0
        while start < len(texts):
            end, chars = start, 0
            while end < len(texts) and (end == start or chars < TOKENIZE_CHUNK_CHARS):
                chars += _chars(texts[end]) if budget is None else min(_chars(texts[end]), budget)
                end += 1
            calls.append(partial(fn, texts[start:end], *args))
            start = end
        if self._closed:
            raise BatcherClosed("model is shutting down")
        out = await self._tok_pool.run(calls)
        if self._closed:
            raise BatcherClosed("model is shutting down")
        return out

    def _tokenize(self, texts: list[str], truncate: bool, direction: str = "right") -> list[np.ndarray]:
        t0 = time.perf_counter()
        ids = self.model.tokenize(texts, truncate=truncate, direction=direction).ids
        self.metrics.tokenization_duration.labels(self._label).observe(time.perf_counter() - t0)
        return ids

    def _check(self, tokens: Tokenized, texts: list[str], truncate: bool) -> None:
        if not truncate:
            limit = self.model.info.max_seq_length
            over = np.nonzero(tokens.lengths > limit)[0]
            if len(over):
                i = int(over[0])
                self.metrics.rejected.labels(self._label, "input_too_long").inc()
                raise InputTooLong(i, int(tokens.lengths[i]), limit, _chars(texts[i]) > self.model.char_budget)
        self._check_total(int(tokens.lengths.sum()))

    def _check_total(self, total: int) -> None:
        """Refuse a request of more than ``max_request_tokens`` tokens in all (RequestTooLarge)."""
        if self.max_request_tokens is not None and total > self.max_request_tokens:
            self.metrics.rejected.labels(self._label, "request_too_large").inc()
            raise RequestTooLarge(total, self.max_request_tokens)

    def _cut(self, window: list[Item]) -> list[list[Item]]:
        """:func:`service.inference.fair_queue.cut_window` with this batcher's limits (sorts ``window`` in place)."""
        return cut_window(
            window,
            max_batch_size=self.max_batch_size,
            max_batch_tokens=self.max_batch_tokens,
            overhead=self.batch_overhead_tokens,
        )

    # ------------------------------------------------------------------ inference
    def _infer(self, ids: list[np.ndarray]) -> np.ndarray:
        t0 = time.perf_counter()
        input_ids, mask = self.model.pad(ids)
        out = self.model.run(input_ids, mask)
        self.metrics.inference_duration.labels(self._label).observe(time.perf_counter() - t0)
        self.metrics.batch_size.labels(self._label).observe(input_ids.shape[0])
        self.metrics.batch_tokens.labels(self._label).observe(input_ids.size)
        return out

    async def _run_batch(self, batch: list[Item]) -> None:
        batch = [(j, i) for j, i in batch if not j.failed and not j.future.done()]
        if not batch:
            return
        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(self._infer_pool, self._infer, [j.tokens.ids[i] for j, i in batch])
        except Exception as e:  # one bad batch fails its requests, never the worker
            log.exception("inference failed for a batch of %d inputs", len(batch))
            for job, _ in batch:
                job.failed = True
                if not job.future.done():
                    job.future.set_exception(BatchFailed(f"inference failed: {type(e).__name__}: {e}"))
            return
        for (job, i), row in zip(batch, out):
            if job.failed or job.future.done():
                continue
            job.out[i] = row
            job.remaining -= 1
            if job.remaining == 0:
                job.future.set_result(job.out)
        self.metrics.inputs.labels(self._label).inc(len(batch))

    async def _run_batch_in_slot(self, batch: list[Item]) -> None:
        try:
            await self._run_batch(batch)
        finally:
            self._slots.release()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            held = False
            try:
                if not self._fair.has_work():
                    self._fair.add(await self._queue.get())
                await self._slots.acquire()  # form a batch only once a worker is free
                held = True
                for job in _drain(self._queue):
                    self._fair.add(job)
                batch = self._fair.next_batch()
                if batch:
                    task = loop.create_task(self._run_batch_in_slot(batch))
                    held = False  # the task releases the slot
                    self._running.add(task)
                    task.add_done_callback(self._running.discard)
                else:  # everything left was cancelled
                    self._slots.release()
                    held = False
            except asyncio.CancelledError:
                raise
            except Exception as e:  # pragma: no cover - defensive: fail the lead request, keep serving
                log.exception("batcher worker error; failing the request at the head of the ring")
                if held:
                    self._slots.release()
                job = self._fair.drop_lead()
                if job is not None:
                    job.failed = True
                    if job.future is not None and not job.future.done():
                        job.future.set_exception(BatchFailed(f"batching failed: {type(e).__name__}: {e}"))
                await asyncio.sleep(0.01)


def _chars(text: str | tuple[str, str]) -> int:
    """Characters of an input: a text, or a reranker's (query, passage) pair (:mod:`service.inference.onnx_reranker`)."""
    return len(text) if isinstance(text, str) else sum(map(len, text))


def _drain(q: asyncio.Queue) -> list:
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except asyncio.QueueEmpty:
            return items
