"""The milvus backend (:class:`~..backend.VectorBackend`): collections in a Milvus server or cluster, shared by every
service replica that names the same ``collections_milvus_uri`` and ``collections_milvus_prefix``.

Each API collection ``name`` is a record in the shared registry (:mod:`.catalog`), a Milvus alias
``<prefix><name>`` and a physical Milvus collection ``<prefix><name>__g<version>`` that the alias points to
(:mod:`.physical`; re-embedding fills a new physical collection and moves the alias: :mod:`.target`). The backend
composes them: :class:`~.physical.PhysicalCollections`, :class:`~.lifecycle.Lifecycle` (create, delete),
:class:`~.target.Reembeddings` and a :class:`~.collection.MilvusCollection` per collection.

Every replica refreshes its view of the registry every ``collections_milvus_refresh_s`` (collections created,
deleted or switched by another replica appear within that time) and drops retired physical collections once no view
can still use them. Durability, replication and backup are Milvus's (``milvus-backup`` for a cluster).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.collections.aliases import Aliases
from service.collections.completion import to_completion
from service.collections.errors import (
    BackendUnavailable,
    CollectionNotFound,
    InvalidCollectionRequest,
    RegistryIncomplete,
)
from service.collections.index import IndexSpec
from service.collections.milvus.catalog import Registry
from service.collections.milvus.client import (
    REACH_TIMEOUT_S,
    SUSPECT_S,
    BoundedClient,
    Breaker,
    answering_client,
    classify,
    connect,
    long_call,
    reachable,
    retry_later_error,
)
from service.collections.milvus.collection import MilvusCollection
from service.collections.milvus.lifecycle import Lifecycle
from service.collections.milvus.physical import PhysicalCollections
from service.collections.milvus.schema import supported_vector
from service.collections.milvus.target import Reembeddings
from service.collections.reads import ReadConsistency
from service.collections.schema import VectorsConfig
from service.collections.shares import Shares, owner_of
from service.collections.stopping import run_stoppable
from service.collections.vector_backend import NAME_RE, CollectionSettings, check_name
from service.tasks import cancel_and_wait

log = logging.getLogger("service.collections.milvus")
T = TypeVar("T")


class MilvusBackend:
    """Collections in Milvus (see the module docstring).

    Args:
        settings: :class:`~..backend.CollectionSettings` (``milvus_uri``, ``milvus_token``, ``milvus_prefix``,
            ``milvus_refresh_s``, ``milvus_claim_ttl_s``, ``milvus_claim_settle_s``, ``milvus_write_timeout_s``,
            ``worker_threads``).
    """

    snapshots = None  # no collection snapshots here: Milvus's tool is milvus-backup (..snapshots.snapshot_store)

    def __init__(self, settings: CollectionSettings) -> None:
        self.settings = settings
        self.prefix = settings.milvus_prefix
        self.client: BoundedClient | None = None
        self.registry: Registry | None = None
        self.physical: PhysicalCollections | None = None  # these once connected (start)
        self._lifecycle: Lifecycle | None = None
        self._reembeddings: Reembeddings | None = None
        self.handles: dict[str, MilvusCollection] = {}
        self._pool = ThreadPoolExecutor(max_workers=settings.worker_threads, thread_name_prefix="milvus")
        self._shares = Shares(settings.worker_threads)  # one collection never holds every thread
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self.breaker = Breaker()
        self._reload_lock = threading.Lock()
        self._reloaded_at = 0.0
        self.aliases = Aliases(lambda: self.registry.aliases(), lambda m: self.registry.put_aliases(m))

    @classmethod
    def from_settings(cls, settings: Any) -> MilvusBackend:
        """The backend tuned by the service settings' ``collections_*`` fields."""
        return cls(CollectionSettings(settings))

    def applied(self, consistency: ReadConsistency) -> str:
        """The consistency a read asking for ``consistency`` gets (see :func:`.collection.read_kw`)."""
        return consistency.applied

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run blocking ``fn(*args, **kw)`` (Milvus calls, a query's CPU work) on the backend's threads: one
        collection's work holds at most all but one of them (:class:`..shares.Shares`), and work whose caller is
        cancelled or released is told to stop (:func:`..stopping.run_stoppable`).

        Raises:
            BackendUnavailable: Milvus is unreachable (at once while the breaker is open, and as soon as it opens
                while waiting; else once the call's timeout ran out: ``fn`` is cut at the timeout + 0.5 s unless
                marked :func:`~.client.long_call`), or Milvus answered "retry later" (:data:`~.client.RETRY_LATER`:
                not ready, not available, still loading: a reload is started). :class:`~.client.Breaker`: what opens it.
        """
        self.breaker.check()
        async with self._shares.gate(owner_of(fn, MilvusCollection)):
            fut = asyncio.ensure_future(run_stoppable(self._pool, self._guarded, fn, *args, **kw))
            try:
                if getattr(fn, "long_call", False) or self.client is None:
                    return await fut
                return await self._bounded(fut)
            except BaseException:
                fut.cancel()  # nobody waits for it any more: its work is told to stop
                raise

    async def _bounded(self, fut: asyncio.Future[T]) -> T:
        """``fut``'s result, or :class:`BackendUnavailable` once the breaker opens or the client's timeout + 0.5 s
        passed (pymilvus may overrun its timeout in its last back-off)."""
        loop = asyncio.get_running_loop()
        t0, bound, suspected = loop.time(), self.client.timeout + 0.5, False
        while not (await asyncio.wait({fut}, timeout=0.25))[0]:
            waited = loop.time() - t0
            if self.breaker.open_since is not None or waited >= bound:
                self.breaker.check()
                raise BackendUnavailable(
                    f"the vector store (Milvus) did not answer within {self.client.timeout} s; retry later"
                )
            if not suspected and waited >= SUSPECT_S:
                suspected = True
                self.breaker.suspect(self._reachable)
        return fut.result()

    def _reachable(self) -> bool:
        return reachable(self.settings.milvus_uri, self.settings.milvus_token, REACH_TIMEOUT_S)

    def _guarded(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        self.breaker.check()  # it may have opened while this call waited for a thread
        try:
            return fn(*args, **kw)
        except BackendUnavailable:
            raise
        except Exception as e:
            kind = classify(e)
            if kind == "unavailable":
                if self.breaker.open_since is None:
                    log.error("milvus: unreachable at %s (%s); 503 until it answers", self.settings.milvus_uri, e)
                self.breaker.trip(type(e).__name__)
                raise BackendUnavailable(f"the vector store (Milvus) is unreachable: {e}; retry later") from e
            if kind not in ("not_loaded", "not_ready"):
                raise
            if kind == "not_loaded":  # not_ready: Milvus answered, so it is reachable; no breaker
                self._pool.submit(self._reload_all)
            raise retry_later_error(e, kind) from e

    def _reload_all(self) -> None:
        """Ask Milvus to load every physical collection this view knows (and the registry), one reload at a time:
        after a Milvus restart they answer "not loaded" until their segments are loaded again."""
        if time.monotonic() - self._reloaded_at < 2.0 or not self._reload_lock.acquire(blocking=False):
            return
        try:
            self._reloaded_at = time.monotonic()
            names = [self.registry.name] + [p for h in list(self.handles.values()) for p in h.physical_collections()]
            for name in names:
                try:
                    self.client.load_collection(name, _async=True)  # Milvus loads in the background
                except Exception as e:
                    log.warning("milvus: reloading %s failed: %s", name, e)
        finally:
            self._reload_lock.release()

    def _probe(self) -> bool:
        """While the breaker is open: release the current connection (its channel would hand its reconnect
        back-off to new ones, see :mod:`.client`), connect afresh and list collections; on success use that
        connection, close the breaker and reload the collections."""
        s = self.settings
        self.client.release()
        # the call timeout, not less: a Milvus just restarted on a busy machine takes seconds to accept a connection
        fresh = answering_client(s.milvus_uri, s.milvus_token, s.milvus_write_timeout_s)
        if fresh is None:
            return False
        self.client.replace(fresh)
        self.breaker.reset()
        log.warning("milvus: reachable again at %s", s.milvus_uri)
        self._reload_all()
        return True

    # --- lifecycle --------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, create the registry if missing, read every collection and start the refresh task.

        Raises:
            pymilvus.MilvusException: Milvus cannot be reached at ``collections_milvus_uri``.
        """
        s = self.settings

        @long_call
        def _connect() -> None:
            client = connect(s.milvus_uri, s.milvus_token, s.milvus_write_timeout_s)
            self.client = BoundedClient(client, s.milvus_write_timeout_s, s.milvus_uri, s.milvus_token)
            self.registry = reg = Registry(self.client, self.prefix)
            reg.ensure()
            # past settle_s after a re-embedding's announcement no replica can write the old collection alone
            settle_s = s.milvus_refresh_s + s.milvus_write_timeout_s + 1.0
            self.physical = PhysicalCollections(self.client, reg, self.prefix, settle_s, s.milvus_claim_ttl_s)
            ttl, claim_settle = s.milvus_claim_ttl_s, s.milvus_claim_settle_s
            self._lifecycle = Lifecycle(self.physical, reg, self.aliases, ttl, claim_settle)
            self._reembeddings = Reembeddings(self.physical, reg, ttl, claim_settle)

        await self.run(_connect)
        await self.run(self.refresh)
        for c in self.list():
            await self.run(self.physical.point_alias, c.name, c.record["physical"])
        # what a crash left: at start only (at every refresh, a make test run saw it drop a re-embedding's collection
        # in use after a simulated claim lapse: not understood yet)
        try:
            await self.run(self.physical.sweep)
        except Exception:
            log.exception("milvus: sweeping left-over physical collections failed (retried at the next start)")
        log.info("collections (milvus at %s, prefix %r): %d", s.milvus_uri, self.prefix, len(self.handles))
        self._task = asyncio.create_task(self._refresh_loop(), name="milvus-refresh")

    async def close(self) -> None:
        """Stop the refresh task and disconnect (the data stays in Milvus). Calls still running finish first, each
        within its timeout; past the timeout + 2 s the close goes on without them."""
        await cancel_and_wait(self._task)
        self._task = None
        loop = asyncio.get_running_loop()
        bound = (self.client.timeout if self.client is not None else 0) + 2
        try:
            await asyncio.wait_for(loop.run_in_executor(None, self._pool.shutdown, True), bound)
        except asyncio.TimeoutError:
            log.warning("milvus: closing with calls still running (Milvus unreachable?)")
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self.client is not None:
            self.client.close()

    async def _refresh_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.milvus_refresh_s)
            try:
                if self.breaker.open_since is not None:  # probe until Milvus answers again
                    await loop.run_in_executor(self._pool, self._probe)
                    continue
                await self.run(self.refresh)
                await self.run(self.physical.drop_retired)  # due retired collections (crash leftovers: at start)
            except BackendUnavailable:
                pass  # logged once, when the breaker opened
            except Exception:
                log.exception("milvus: registry refresh failed (views keep their last state)")

    # --- the shared registry ----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read every record: new collections appear, deleted ones close, switched ones move. A collection whose
        record is missing from the read while Milvus still holds its alias stays as last seen (a short read, see
        :mod:`.lifecycle`; its requests answer 503 once its view is older than ``refresh_s``)."""
        recs, stats = self.registry.records()
        for name, rec in recs.items():
            h = self.handles.get(name)
            if h is None:
                self.handles[name] = self.view(rec, stats.get(name))
            else:
                h.update(rec, stats.get(name))
        for name in set(self.handles) - set(recs):
            if self.physical.aliased(name):
                log.warning("milvus: the registry read has no row for %s, whose alias exists: kept as last seen", name)
            elif (gone := self.handles.pop(name, None)) is not None:  # a delete on another thread may have won
                gone.closed = True
        self.aliases.reload()

    def refresh_one(self, name: str) -> None:
        """Re-read the record of ``name`` now.

        Raises:
            RegistryIncomplete: no record, but Milvus holds its alias (the view, if any, is kept).
        """
        rec = self.registry.record(name)
        h = self.handles.get(name)
        if rec is None:
            if self.physical.aliased(name):
                raise RegistryIncomplete(name)
            if h is not None:
                self.handles.pop(name, None)
                h.closed = True
        elif h is None:
            self.handles[name] = self.view(rec)
        else:
            h.update(rec, h.shared_status)

    def view(self, record: dict[str, Any], status: dict[str, Any] | None = None) -> MilvusCollection:
        """A collection handle viewing ``record`` (and its shared re-embedding ``status``) read from the registry;
        :meth:`refresh_one` re-reads it."""
        return MilvusCollection(
            self.client, self.refresh_one, self.settings.milvus_refresh_s, self._reembeddings, record, status
        )

    # --- collections ------------------------------------------------------------------------------------------
    def get(self, name: str) -> MilvusCollection:
        """The collection ``name``, or that the alias ``name`` names (re-read from the registry if this view does not
        know it yet). Raises CollectionNotFound."""
        name = name if name in self.handles else self.aliases.resolve(name) or name  # an alias: this view's
        h = self.handles.get(name)
        if h is None and NAME_RE.match(name):
            self.refresh_one(name)
            h = self.handles.get(name)
        if h is None or h.closed:
            raise CollectionNotFound(f"collection {name!r} not found")
        return h

    def list(self) -> list[MilvusCollection]:
        """Every collection this view knows, sorted by name."""
        return [h for _, h in sorted(self.handles.items())]

    async def create(self, name: str, vectors: VectorsConfig) -> MilvusCollection:
        """Create collection ``name`` (see :meth:`~..backend.VectorBackend.create`): Milvus 2.3 holds one vector field
        per collection and no sparse vectors, so ``vectors`` must be one model-bound unnamed vector.

        Raises:
            InvalidCollectionRequest: bad name, unsupported index type, or other vectors (``unsupported``: the
                engine's limit, named).
            CollectionExists: the name is taken (here or by another replica).
            RegistryIncomplete: Milvus holds its alias but the registry read has no record (:mod:`.lifecycle`).
        """
        check_name(name)
        b = supported_vector(vectors)
        return await to_completion(self._locked(self._create, name, b.spec, b.model, b.name))

    async def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the pool under the backend's lock: a create or a delete, which completes once begun
        whatever its caller does (:func:`~..completion.to_completion`): the lock is held until Milvus has answered."""
        async with self._lock:
            return await self.run(fn, *args)

    @long_call
    def _create(self, name: str, spec: IndexSpec, model: dict[str, Any], vector_name: str = "") -> MilvusCollection:
        rec = self._lifecycle.create(name, spec, model, vector_name)
        self.handles[name] = h = self.view(rec)
        return h

    async def update_vectors(self, name: str, change: Callable[[VectorsConfig], VectorsConfig | None]) -> None:
        """Add or drop a named vector (:meth:`~..backend.VectorBackend.update_vectors`): only a change that changes
        nothing passes (deleting a name the collection lacks, adding the vector it has).

        Raises:
            CollectionNotFound; what ``change`` raises; InvalidCollectionRequest (``unsupported``): any other change.
        """
        if change((await self.run(self.get, name)).vectors) is not None:
            raise InvalidCollectionRequest(
                "the milvus backend holds one vector per collection: Milvus 2.3 has one vector field per collection "
                "and no sparse vectors (use the embedded backend to add or delete named vectors)",
                param="vector_name",
                code="unsupported",
            )

    async def update_aliases(self, actions: list[dict[str, Any]]) -> None:
        """Apply Qdrant's alias ``actions``, all or none (:meth:`..aliases.Aliases.update`)."""
        async with self._lock:
            await self.run(self.aliases.update, actions, self.registry.has)

    async def delete(self, name: str) -> None:
        """Delete collection ``name`` (not an alias): record, aliases, Milvus alias, physical collections, claims.

        Raises:
            CollectionNotFound: no such collection (at once for a name that is no collection name: Milvus never sees it).
            RegistryIncomplete: Milvus holds its alias but the registry read has no record (:mod:`.lifecycle`).
        """
        if not NAME_RE.match(name):
            raise CollectionNotFound(f"collection {name!r} not found")
        await to_completion(self._locked(self._delete, name))

    @long_call
    def _delete(self, name: str) -> None:
        self._lifecycle.delete(name)
        h = self.handles.pop(name, None)
        if h is not None:
            h.closed = True
