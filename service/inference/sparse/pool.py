"""A server-side sparse model's document vectors made in worker processes (``sparse_workers``): tokenising and
stemming is pure-Python CPU work that holds the interpreter lock, so on a machine with two or more cores it runs
beside the event loop and the writes only in another process. Queries stay in the serving process (one short
text: a process round trip would cost more than it saves).

The workers are started on the first batch (``spawn``: a fresh interpreter, nothing inherited from the threads of
the service) and each builds its own model (its own stem caches); a worker that dies (killed) fails the batch it
held, which is then made in the serving process (the same vectors), and the pool is started again for the next.
Each exits within :data:`WATCH_S` once the service is gone, however it ended (its parent process changes).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

_MODEL: Any = None  # the worker process's model (made by _start)
WATCH_S = 0.5  # how often a worker checks that the service is still there
MIN_TEXTS = 32  # smaller batches are made in this process (a process round trip would cost more than it saves)


def _start(make: Callable[[], Any], parent: int) -> None:
    """A worker's start: its model, and a watch that ends the worker once the service (``parent``) is gone."""
    global _MODEL
    _MODEL = make()
    threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:  # re-parented when the service exits, however it exits (SIGKILL included)
        time.sleep(WATCH_S)
    os.kill(os.getpid(), signal.SIGTERM)  # nothing of the worker's to save: its batches are the service's


def _call(method: str, texts: list[str]) -> Any:
    return getattr(_MODEL, method)(texts)


class ProcessPooled:
    """``documents``/``document_arrays`` of the model ``make()`` builds, run in ``workers`` processes (a batch split
    into one slice per worker; a batch of fewer than :data:`MIN_TEXTS` texts, and ``query``, by ``local``: the same
    model in this process, so the vectors are the same either way).

    Args:
        make: a picklable callable (module-level) building the model in a worker.
        workers: processes (>= 1).
        local: the in-process model for queries (a :class:`~service.inference.sparse.Lazy`).
    """

    def __init__(self, make: Callable[[], Any], workers: int, local: Any) -> None:
        self._make, self._workers, self._local = make, workers, local
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                ctx = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(
                    self._workers, ctx, initializer=_start, initargs=(self._make, os.getpid())
                )
            return self._pool

    def document_arrays(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The packed vectors of ``texts`` (:data:`~service.inference.sparse.Packed`), made by the workers
        (blocking: call it off the event loop)."""
        if len(texts) < MIN_TEXTS:
            return self._local.document_arrays(texts)
        parts = self._run("document_arrays", texts)
        if len(parts) == 1:
            return parts[0]
        shift = np.cumsum([0] + [len(p[0]) for p in parts[:-1]])
        offsets = np.concatenate([parts[0][2][:1]] + [p[2][1:] + s for p, s in zip(parts, shift)])
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), offsets

    def documents(self, texts: list[str]) -> list[dict[str, Any]]:
        """The document vectors ``{indices, values}`` of ``texts`` (blocking), the model's, made by the workers."""
        if len(texts) < MIN_TEXTS:
            return self._local.documents(texts)
        return [v for part in self._run("documents", texts) for v in part]

    def _run(self, method: str, texts: list[str]) -> list[Any]:
        """``method`` of the workers' models over ``texts`` split into one slice per worker, the results in order."""
        pool = self._get()
        step = -(-len(texts) // self._workers)
        try:
            futures = [pool.submit(_call, method, texts[i : i + step]) for i in range(0, len(texts), step)]
            return [f.result() for f in futures]
        except BrokenProcessPool:  # a worker died (killed): this batch made here, a new pool for the next one
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            return [getattr(self._local, method)(texts)]

    def query(self, text: str) -> dict[str, Any]:
        """The query vector of ``text`` (in this process, blocking)."""
        return self._local.query(text)

    def close(self) -> None:
        """Stop the workers (those busy finish their batch first)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
