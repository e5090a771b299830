"""Collections follow the active model: background re-embedding towards it, then an atomic switch.

When the active model changes (:meth:`ModelControl.activate` calls :meth:`Reembedder.on_activate`), every collection
embedded by another model is re-embedded from its stored texts, through the backend's
:class:`~.backend.ReembedTarget` (so the same steps run on every backend):

1. ``begin_reembed`` claims and attaches a target for the new model (an interrupted one for the same model is
   resumed; on a shared backend another replica may hold the claim, and this one then waits and checks again).
2. The task asks the target for live points still lacking a target vector, embeds their texts with the target
   model (through its batcher, beside live traffic, paced by ``collections_reembed_rate``; a full queue is waited
   out, live requests first) and writes the vectors. A point upserted as a vector without text cannot be
   re-embedded: the re-embedding then fails (state ``failed``, naming the cause) and the collection keeps its model.
3. Meanwhile searches and upserts keep using the collection's current model; an upsert is embedded by *both*
   models and written to both (:class:`~.service.CollectionService`), so nothing written during the sweep is missed.
4. When no point lacks a target vector, ``complete`` switches the collection atomically (new index, model and
   dimension together); points added meanwhile without one send the task back to step 2.

Progress is reported in ``GET /collections/{name}`` under ``reembedding``:
``{state: running|completed|failed|cancelled, target_model, dimension, done, total, rate_per_s, started_at,
finished_at, error}``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

import numpy as np

from service.collections.errors import BackendUnavailable, InferenceOverloaded, ModelNotReady
from service.collections.ports import InferencePort, ModelRef, ModelSpec
from service.collections.vector_backend import CollectionHandle, ReembedTarget, VectorBackend, model_id, same_model

log = logging.getLogger("service.collections.reembed")

BATCH = 64  # texts per embedder call of the background re-embedding
CLAIM_RETRY_S = 2.0  # how often a replica without the claim checks whether the re-embedding still needs it
PUBLISH_EVERY_S = 1.0  # how often progress is published (shared backends: to the other replicas)


def _placeholder(target: dict[str, Any], dimension: int, total: int) -> dict[str, Any]:
    return {
        "state": "running",
        "target_model": target,
        "dimension": dimension,
        "done": 0,
        "total": total,
        "rate_per_s": None,
        "started_at": time.time(),
        "finished_at": None,
        "error": None,
    }


class Reembedder:
    """Runs at most one re-embedding task per collection whose model is not the active one.

    Args:
        inference: the :class:`~.ports.InferencePort`; this follows its active model and tells it which models the
            collections are on (kept loaded).
        backend: the :class:`~.vector_backend.VectorBackend`.
        owner: this process's name in claims on shared backends (default ``host:pid``).
    """

    def __init__(self, inference: InferencePort, backend: VectorBackend, owner: str = "") -> None:
        self.inference = inference
        self.backend = backend
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.tasks: dict[str, asyncio.Task] = {}
        self._targets: dict[str, dict[str, Any]] = {}  # collection -> the model its task re-embeds towards
        self._drop: set[str] = set()  # collections whose cancelled task should discard its target vectors
        inference.follow(self.on_activate, self.models_in_use)

    def models_in_use(self) -> set[tuple[str, str]]:
        """``{(collection, model_id)}``: every collection needs the model it is embedded with (searches, upserts)."""
        return {(c.name, model_id(c.model)) for c in self.backend.list() if c.model is not None}

    async def start(self) -> None:
        """Resume: load the models collections are on (best effort) and re-embed those not on the active model."""
        for c in self.backend.list():
            await self.adopt(c)

    async def adopt(self, c: CollectionHandle) -> None:
        """Take on collection ``c`` as found (at start, or recovered from a snapshot, replacing one of its name):
        stop a re-embedding of the collection it replaces, load its model (best effort), and re-embed it if it is
        not on the active model. A collection without a model-bound vector has nothing to re-embed."""
        t = self.tasks.pop(c.name, None)
        if t is not None and not t.done():
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
        if c.model is None:
            return
        try:
            await self.inference.load(ModelRef.from_dict(c.model))
        except Exception as e:
            log.warning(
                "collection %s: its model %s cannot be loaded (%s); searches answer 409 until re-embedding finishes",
                c.name,
                model_id(c.model),
                e,
            )
        try:
            act = self.inference.active_model()
        except ModelNotReady:  # no active model yet
            return
        await self._ensure(c, act)

    async def on_activate(self, new: ModelSpec) -> None:
        """Activation listener: point every collection at ``new``."""
        for c in self.backend.list():
            await self._ensure(c, new)

    async def _count(self, c: CollectionHandle) -> int:
        return await self.backend.run(lambda: c.count)  # a network call on a shared backend: off the event loop

    async def _ensure(self, c: CollectionHandle, info: ModelSpec) -> None:
        if c.model is None:  # only client-supplied and sparse vectors: they do not follow the model
            return
        target = info.ref.to_dict()
        t = self.tasks.get(c.name)
        running = t is not None and not t.done()
        if running and same_model(self._targets.get(c.name), target):
            return  # already on its way there
        if same_model(c.model, target):
            if running:
                self._drop.add(c.name)
                t.cancel()
                c.reembed_status = {
                    **(c.reembed_status or {}),
                    "state": "cancelled",
                    "finished_at": time.time(),
                    "error": f"the active model is {model_id(target)} again, which the collection uses",
                }
            return
        if running:
            t.cancel()
        c.reembed_status = _placeholder(target, info.dimension, await self._count(c))  # visible before the task starts
        self._targets[c.name] = target
        self.tasks[c.name] = asyncio.create_task(self._run(c, info, target, t), name=f"reembed-{c.name}")

    async def _encode(self, texts: list[str], info: ModelSpec) -> np.ndarray:
        """Embed points' texts with the target model and its document prompt (as upserts do); a full queue (live
        traffic first) is waited out, not a failure."""
        delay = 0.05
        while True:
            try:
                return await self.inference.encode(info.ref, texts, role="document")
            except InferenceOverloaded:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _claim(self, c: CollectionHandle, target: dict[str, Any], dimension: int) -> ReembedTarget | None:
        """The attached target, once this process holds the claim; None when the collection reached ``target``
        (another replica finished it)."""
        while True:
            if same_model(c.model, target):
                return None
            tg = await self.backend.run(c.begin_reembed, target, dimension, self.owner)
            if tg is not None:
                return tg
            await asyncio.sleep(CLAIM_RETRY_S)  # another replica re-embeds; take over if its claim lapses

    async def _run(
        self, c: CollectionHandle, info: ModelSpec, target: dict[str, Any], previous: asyncio.Task | None
    ) -> None:
        if previous is not None:
            try:
                await previous
            except (asyncio.CancelledError, Exception):
                pass
        self._drop.discard(c.name)
        run = self.backend.run
        tg: ReembedTarget | None = None
        try:
            self.inference.loaded(info.ref.id)  # ModelNotFound: fails the re-embedding
            while True:
                try:
                    tg = await self._claim(c, target, info.dimension)
                    if tg is None:  # another replica completed it: show the shared status, not this one's placeholder
                        c.reembed_status = None
                        return
                    if await self._sweep(c, tg, info):
                        return
                    # the claim went to another replica (two claims can overlap on a shared backend): wait, and take
                    # over if its claim lapses
                    log.info(
                        "collection %s: another replica holds the re-embedding to %s; waiting", c.name, info.ref.id
                    )
                    await run(tg.abandon, False)
                except BackendUnavailable as e:  # a shared store's outage pauses the sweep; its claim lapses and
                    # the re-embedding resumes from the stored target vectors once the store answers again
                    log.warning("collection %s: re-embedding to %s paused: %s", c.name, info.ref.id, e)
                    await asyncio.sleep(CLAIM_RETRY_S)
                tg = None
        except asyncio.CancelledError:
            if tg is not None:
                tg.status.update(state="cancelled", finished_at=time.time())
                await asyncio.shield(run(tg.abandon, c.name in self._drop))
            raise
        except Exception as e:
            log.exception("collection %s: re-embedding to %s failed", c.name, info.ref.id)
            failed = {"state": "failed", "error": f"{type(e).__name__}: {e}", "finished_at": time.time()}
            if tg is not None:
                tg.status.update(failed)
                await run(tg.abandon, False)
            else:
                c.reembed_status = {**(c.reembed_status or {}), **failed}

    async def _sweep(self, c: CollectionHandle, tg: ReembedTarget, info: ModelSpec) -> bool:
        """Embed every point lacking a target vector, then switch (the module docstring's steps 2-4).

        Returns:
            True when the collection switched; False when this process lost the claim meanwhile.
        """
        run = self.backend.run
        st = tg.status
        log.info("collection %s: re-embedding from %s to %s", c.name, model_id(c.model), info.ref.id)
        t0, own, published, cursor = time.monotonic(), 0, 0.0, None  # own: points this task embedded
        while True:
            rows, cursor = await run(tg.pending, cursor, BATCH)
            if not rows:
                if await run(tg.complete):
                    break
                cursor = None  # points added meanwhile without a target vector: sweep again
                continue
            if not all(r[1] for r in rows):  # points upserted as vectors without text: no model can re-make them
                raise ValueError(
                    "the collection holds points upserted as vectors without text, which cannot be re-embedded: "
                    "upsert them again with their text (or delete them), then activate the model again"
                )
            vectors = await self._encode([r[1] for r in rows], info)
            await run(tg.write, [r[0] for r in rows], vectors)
            st["done"] += len(rows)
            own += len(rows)
            st["total"] = max(await self._count(c), st["done"])
            el = time.monotonic() - t0
            rate = float(self.backend.settings.reembed_rate or 0.0)
            if rate > 0 and (slack := own / rate - el) > 0:
                await asyncio.sleep(slack)  # collections_reembed_rate: leave the CPU to live traffic
                el = time.monotonic() - t0
            st["rate_per_s"] = round(own / el, 2) if el > 0 else None
            if time.monotonic() - published >= PUBLISH_EVERY_S:
                if not await run(tg.renew):
                    return False
                await run(tg.publish_status)
                published = time.monotonic()
        el = time.monotonic() - t0
        n = await self._count(c)
        st.update(state="completed", done=n, total=n, finished_at=time.time(), seconds=round(el, 3))
        st["rate_per_s"] = round(own / el, 2) if el > 0 else None
        await run(tg.publish_status)
        await run(tg.abandon, False)  # detach (a no-op after the switch) and release
        return True

    async def close(self) -> None:
        """Stop every re-embedding (target vectors stay, so a restart resumes them)."""
        tasks = [t for t in self.tasks.values() if not t.done()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self.tasks.clear()
