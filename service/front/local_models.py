"""The models a front process runs itself (``front_inference``): :class:`LocalModels`.

Behind fronts, one core process ran every batch, and its one interpreter (event loop, batcher, the Python around
each ONNX Runtime call) bounded a GPU deployment while the GPU stayed mostly idle (docs/performance.md, "Several
serving processes on one port": 8 fronts, 20k STS-B sentences/s, the SMs 16-18 % busy; four independent processes
had served 2.7x one). With ``front_inference`` each front loads the embedding models the core has loaded (the same
artifact directories, on the same providers: one ONNX Runtime session, batcher and tokenizer pool per front and
model) and runs the embedding requests itself, so the work is spread over the fronts' interpreters.

Which model answers stays the core's decision: before each request the front reads the core's published registry
(``service.front.published``: one ``stat``, the file re-read when it was replaced) and resolves the request's
``model`` field there exactly as the core would. It runs the request only when it holds that very model (its
``name:version`` and sha256); otherwise (not loaded yet, a reranker, a load that failed) the request goes to the
core as without ``front_inference``. A hot swap so stays atomic: an activation is in the file before ``/admin``
answers, and from then on no front runs the previous model for a new request; a model the core no longer has is
closed here once its queued work is done. Collections, re-embedding and everything else stay the core's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from service.front.published import NOTHING, Published, PublishedModel, read
from service.inference.model_registry import LoadedModel, load_model
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger("service.front")

#: seconds between a front's reads of the published models when no request comes (it loads models meanwhile)
POLL_S = 1.0
#: seconds before a model that failed to load here is tried again
RETRY_S = 30.0

_Key = tuple[str, str]  # (name:version, sha256)


class LocalModels:
    """The front's own copies of the core's embedding models (module docstring).

    Args:
        settings: the service settings (providers, threads, batching: as the core's).
        metrics: the front's metrics (its batchers' tokenization and inference times, batch sizes).
        published: the core's published models file (``service.front.published.MODELS_FILE``).
    """

    def __init__(self, settings: Settings, metrics: Metrics, published: Path) -> None:
        self.settings, self.metrics, self.path = settings, metrics, published
        self._stamp: tuple[int, int, int] | None = None
        self._published = NOTHING
        self._models: dict[_Key, LoadedModel] = {}
        self._loading: set[_Key] = set()
        self._failed: dict[_Key, float] = {}
        self._tasks: set[asyncio.Task] = set()
        self._poll: asyncio.Task | None = None

    def start(self) -> None:
        """Read the published models now and every :data:`POLL_S` seconds (on the running loop)."""
        self._poll = asyncio.get_running_loop().create_task(self._polling())

    async def close(self) -> None:
        """Stop polling and loading; drain and close every model's batcher."""
        for t in [self._poll, *self._tasks]:
            if t is not None:
                t.cancel()
        for t in [self._poll, *self._tasks]:
            if t is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        models, self._models = list(self._models.values()), {}
        for lm in models:
            await lm.batcher.close()

    def get(self, model: str | None) -> LoadedModel | None:
        """The model to run a request naming ``model`` (None: the active one) here, or None: the core runs it."""
        m = self.published().resolve(model)
        if m is None or m.reranker:
            return None
        return self._models.get((m.id, m.sha256))

    def published(self) -> Published:
        """The core's published models as of now (re-read when the file was replaced; loads and unloads follow)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp != self._stamp:
            self._stamp = stamp
            self._published = read(self.path) if stamp is not None else NOTHING
            self._follow()
        return self._published

    async def _polling(self) -> None:
        while True:
            self.published()
            await asyncio.sleep(POLL_S)

    def _follow(self) -> None:
        """Start loading the published embedding models not held here; close those no longer published."""
        wanted = {(m.id, m.sha256): m for m in self._published.models if not m.reranker}
        now = time.monotonic()
        for key, m in wanted.items():
            failed_recently = key in self._failed and now - self._failed[key] < RETRY_S
            if key in self._models or key in self._loading or failed_recently:
                continue
            self._loading.add(key)
            self._spawn(self._load(key, m))
        for key in [k for k in self._models if k not in wanted]:
            self._spawn(self._models.pop(key).batcher.close())

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load(self, key: _Key, m: PublishedModel) -> None:
        try:
            lm = await load_model(self.settings, self.metrics, m.name, m.version, path=Path(m.path))
        except Exception as e:  # ModelLoadError, or anything a provider raises (out of device memory): never fatal
            log.warning("front: cannot run %s here (%s); the core runs its requests", m.id, e)
            self._failed[key] = time.monotonic()
            return
        finally:
            self._loading.discard(key)
        if (lm.info.id, lm.info.sha256) != key or key not in {(p.id, p.sha256) for p in self._published.models}:
            await lm.batcher.close()  # another artifact than the core's, or unloaded by the core meanwhile
            if (lm.info.id, lm.info.sha256) != key:
                log.warning("front: %s holds %s, not the core's %s", m.path, lm.info.id, m.id)
                self._failed[key] = time.monotonic()
            return
        self._models[key] = lm
        log.info("front (pid %d) runs %s itself", os.getpid(), m.id)
