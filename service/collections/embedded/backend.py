"""The embedded backend (the default): every collection under ``<data_dir>/collections/`` in this process, as SQLite
files plus FAISS indexes, with background upkeep; implements :class:`~..backend.VectorBackend`.

Blocking work (SQLite, FAISS, files) runs on a dedicated thread pool, never on the
event loop. A background task trains/rebuilds indexes when due and writes FAISS
snapshots (after ``snapshot_every`` writes, ``snapshot_interval_s`` after the
last snapshot if anything changed, and right after a training or rebuild);
:meth:`EmbeddedBackend.close` snapshots what changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from artifact_contract.fsio import atomic_write_bytes, fsync_dir
from service.collections.aliases import Aliases
from service.collections.completion import to_completion
from service.collections.embedded.collection import Collection
from service.collections.embedded.pool import SharedPool
from service.collections.embedded.snapshot_store import EmbeddedSnapshots, finish_swaps
from service.collections.errors import CollectionClosed, CollectionExists, CollectionNotFound
from service.collections.schema import VectorsConfig
from service.collections.vector_backend import NAME_RE, CollectionSettings, check_name
from service.tasks import cancel_and_wait

log = logging.getLogger("service.collections")
T = TypeVar("T")


def _init_worker(faiss_threads: int) -> None:
    """Pool thread start: cap FAISS's OpenMP threads (a per-thread OpenMP setting)."""
    import faiss

    faiss.omp_set_num_threads(faiss_threads)


class EmbeddedBackend:
    """Owns the open collections of this process.

    Args:
        root: the collections directory (``<data_dir>/collections``).
        settings: :class:`CollectionSettings`.
        snapshots_dir: where collection snapshots are kept (default: ``snapshots`` beside ``root``).
    """

    def __init__(self, root: Path, settings: CollectionSettings | None = None, snapshots_dir: Any = None) -> None:
        self.root = Path(root)
        self.settings = settings or CollectionSettings()
        self.collections: dict[str, Collection] = {}
        self._lock = asyncio.Lock()
        self._pool = SharedPool(  # one collection never holds every thread (.pool)
            self.settings.worker_threads,
            thread_name_prefix="collections",
            initializer=_init_worker,
            initargs=(self.settings.faiss_threads,),
        )
        self._task: asyncio.Task | None = None
        self.snapshots = EmbeddedSnapshots(self, Path(snapshots_dir or self.root.parent / "snapshots"))
        self.aliases = Aliases(self._load_aliases, self._save_aliases)  # in <data_dir>/aliases.json

    @classmethod
    def from_settings(cls, settings: Any) -> EmbeddedBackend:
        """The backend of ``<settings.data_dir>/collections`` tuned by the ``collections_*`` settings, its snapshots
        in ``collections_snapshots_dir`` (default ``<data_dir>/snapshots``)."""
        root = Path(settings.data_dir) / "collections"
        return cls(root, CollectionSettings(settings), settings.collections_snapshots_dir)

    def list(self) -> list[Collection]:
        """The open collections, sorted by name."""
        return [c for _, c in sorted(self.collections.items())]

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run blocking ``fn(*args, **kw)`` on the collections thread pool (:class:`.pool.SharedPool`: a collection's
        share of it bounded; stopped when the awaiting coroutine is cancelled)."""
        return await self._pool.run(fn, *args, **kw)

    def applied(self, consistency: Any) -> str:
        """Always ``strong``: one process holds the data, and a write is answered once searchable."""
        return "strong"

    # --- lifecycle ------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open every collection in ``root`` (loading snapshots and replaying writes) and start upkeep."""
        self.root.mkdir(parents=True, exist_ok=True)
        await self.run(finish_swaps, self.root)
        await self.run(self.aliases.reload)
        await self.run(self.snapshots.start)
        for p in sorted(self.root.iterdir()):
            if p.name.startswith("."):  # unfinished create, delete or recovery
                await self.run(shutil.rmtree, p, True)
                continue
            if p.is_dir() and NAME_RE.match(p.name):
                self.collections[p.name] = await self.run(self._open, p)
        log.info("collections: %d open under %s", len(self.collections), self.root)
        self._task = asyncio.create_task(self._upkeep(), name="collections-upkeep")

    def _open(self, path: Path) -> Collection:
        return Collection.open(path, exact_filter_threshold=self.settings.exact_filter_threshold)

    async def close(self) -> None:
        """Stop upkeep, snapshot collections with unsnapshotted writes, close them all."""
        await cancel_and_wait(self._task)
        self._task = None
        for c in list(self.collections.values()):
            try:
                await self.run(c.snapshot)
            except Exception:
                log.exception("collection %s: final snapshot failed (SQLite still has every write)", c.name)
            await self.run(c.close)
        self.collections.clear()
        self._pool.shutdown(wait=True)

    async def _upkeep(self) -> None:
        s = self.settings
        while True:
            await asyncio.sleep(s.maintenance_interval_s)
            for c in list(self.collections.values()):
                try:
                    if c.needs_maintenance() and await self.run(c.maintain):
                        await self.run(c.snapshot)  # persist the expensive result (trained codebooks, rebuilt graph)
                    n = c.changes_since_snapshot()
                    if n >= s.snapshot_every or (n > 0 and c.seconds_since_snapshot() >= s.snapshot_interval_s):
                        await self.run(c.snapshot)
                except CollectionClosed:
                    pass
                except Exception:
                    log.exception("collection %s: background upkeep failed", c.name)

    # --- registry ---------------------------------------------------------------------------------------------------
    def _load_aliases(self) -> dict[str, str]:
        p = self.root.parent / "aliases.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def _save_aliases(self, aliases: dict[str, str]) -> None:
        atomic_write_bytes(self.root.parent / "aliases.json", json.dumps(aliases, indent=1).encode())

    async def update_aliases(self, actions: list[dict[str, Any]]) -> None:
        """Apply Qdrant's alias ``actions`` all or none (:meth:`..aliases.Aliases.update`)."""
        async with self._lock:
            await self.run(self.aliases.update, actions, self.collections.__contains__)

    def get(self, name: str) -> Collection:
        """The open collection ``name`` (or that the alias ``name`` names).

        Raises:
            CollectionNotFound: no such collection.
        """
        c = self.collections.get(name) or self.collections.get(self.aliases.resolve(name) or "")
        if c is None:
            raise CollectionNotFound(f"collection {name!r} not found")
        return c

    async def create(self, name: str, vectors: VectorsConfig) -> Collection:
        """Create collection ``name`` holding ``vectors`` (checked: :func:`~..schema.new_vectors_config`). Once begun
        it completes whatever the caller does (:func:`~..completion.to_completion`), and one that fails leaves
        nothing behind: the name is free again.

        Raises:
            InvalidCollectionRequest: bad name.
            CollectionExists: the name is taken.
        """
        check_name(name)
        return await to_completion(self._create(name, vectors))

    async def _create(self, name: str, vectors: VectorsConfig) -> Collection:
        async with self._lock:
            if name in self.collections or self.aliases.resolve(name):
                raise CollectionExists(f"collection or alias {name!r} already exists")
            path = self.root / name
            if await self.run(path.exists):
                raise CollectionExists(f"collection {name!r} already exists")
            try:
                c = await self.run(
                    Collection.create, path, vectors, exact_filter_threshold=self.settings.exact_filter_threshold
                )
            except FileExistsError as e:
                raise CollectionExists(f"collection {name!r} already exists") from e
            except BaseException:
                await self.run(_discard, path)  # made here and not opened: the name is free again
                raise
            self.collections[name] = c
            return c

    async def update_vectors(self, name: str, change: Callable[[VectorsConfig], VectorsConfig | None]) -> None:
        """Add or drop a named vector of collection ``name`` (or of the one the alias names):
        :meth:`~.collection.Collection.update_vectors`, durable when it returns.

        Raises:
            CollectionNotFound; what ``change`` raises.
        """
        await self.run(self.get(name).update_vectors, change)

    async def delete(self, name: str) -> None:
        """Delete collection ``name`` (not an alias), its aliases and its files (waits for running operations on it).
        Once begun it completes whatever the caller does (:func:`~..completion.to_completion`): the collection is
        closed and its directory moved aside before its name leaves the registry, all under the backend's lock, so
        nobody sees it unlisted while its files still hold the name.

        Raises:
            CollectionNotFound: no such collection.
        """
        await to_completion(self._delete(name))

    async def _delete(self, name: str) -> None:
        async with self._lock:
            c = self.collections.get(name)  # a collection's own name: deleting by an alias is refused
            if c is None:
                raise CollectionNotFound(f"collection {name!r} not found")
            await self.run(c.close)  # new operations on it fail (CollectionClosed: 404); running ones end first
            trash = c.path.with_name(f".deleted-{name}-{time.monotonic_ns()}")

            def _move() -> None:
                os.rename(c.path, trash)
                fsync_dir(c.path.parent)

            await self.run(_move)
            await self.run(self.aliases.drop_collection, name)
            del self.collections[name]
        await self.run(shutil.rmtree, trash, True)

    async def swap_in(self, name: str, ready: Path) -> Collection:
        """Make the collection directory ``ready`` (in ``root``) collection ``name``, replacing the open one (closed
        first, waiting for its running operations); returns it open. If it fails to open, the replaced one is put
        back and the error raised."""
        async with self._lock:
            old = self.collections.pop(name, None)
            if old is not None:
                await self.run(old.close)
            path = self.root / name
            trash = self.root / f".deleted-{name}-{time.monotonic_ns()}"

            def _swap() -> None:
                if path.exists():
                    os.rename(path, trash)
                os.rename(ready, path)
                fsync_dir(self.root)

            await self.run(_swap)
            try:
                c = await self.run(self._open, path)
            except Exception:
                log.exception("collection %s: the recovered copy does not open; the previous one stays", name)

                def _back() -> None:
                    os.rename(path, ready.with_name(f".failed-{name}-{time.monotonic_ns()}"))
                    if trash.exists():
                        os.rename(trash, path)
                    fsync_dir(self.root)

                await self.run(_back)
                if path.exists():
                    self.collections[name] = await self.run(self._open, path)
                raise
            self.collections[name] = c
        await self.run(shutil.rmtree, trash, True)
        return c


def _discard(path: Path) -> None:
    """Remove the directory of a collection whose creation failed (if it got as far as making one)."""
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
        fsync_dir(path.parent)
