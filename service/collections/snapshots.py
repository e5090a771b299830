"""Collection snapshots: a backend's optional capability (:class:`SnapshotStore`) and the recovery policy over it.

A snapshot is one file per collection and write (the embedded backend's format: :mod:`.embedded.archive`), listed,
downloaded and deleted by name, kept under the snapshots directory (``collections_snapshots_dir``, default
``<data_dir>/snapshots``) in a folder per collection, and not deleted with the collection (a deleted collection can
be recovered from its snapshots). Recovery (Qdrant's ``PUT /collections/{name}/snapshots/recover``,
https://api.qdrant.tech/api-reference/snapshots/recover-from-snapshot) replaces the collection of that name, or
creates it, from a snapshot named by location: ``file://`` inside the snapshots directory, or ``http(s)://`` (another
server's download URL: how a collection moves between machines; bounded in size and time: :mod:`.snapshot_fetch`),
or uploaded (``POST .../snapshots/upload``, a multipart form whose ``snapshot`` field is the file, streamed to disk).
A recovery loads no model: the models the snapshot is bound to must be loaded already (:meth:`Recovery.vet`). The
recovered collection is then handed to the :attr:`Recovery.listeners` (the re-embedder: if its model is not the
active one, the collection is re-embedded towards the active model, as at start).

The milvus backend has no snapshots (Milvus's own tool is ``milvus-backup``): asking answers 422 ``unsupported``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from service.collections.completion import to_completion
from service.collections.errors import InvalidCollectionRequest, ModelNotFound, ModelNotReady, ModelUnavailable
from service.collections.ports import InferencePort, ModelRef
from service.collections.snapshot_fetch import DOWNLOADS, FetchLimits, download_path, fetch
from service.collections.vector_backend import NAME_RE, CollectionHandle, VectorBackend

__all__ = ["DOWNLOADS", "Recovery", "SnapshotStore", "clean_downloads", "download_path", "snapshot_store"]
T = TypeVar("T")
log = logging.getLogger("service.collections")
_tasks: set[asyncio.Task] = set()
#: checks the ``(model record, dimension)`` pairs a snapshot's vectors are bound to (raises to refuse it)
Vet = Callable[[list[tuple[dict[str, Any], int]]], None]


class SnapshotStore(Protocol):
    """The snapshots of a backend's collections (``backend.snapshots``; None where the backend has none)."""

    directory: Path

    async def create(self, name: str) -> dict[str, Any]:
        """Snapshot collection ``name`` as of now; returns ``{name, creation_time, size, checksum}`` (Qdrant's
        ``SnapshotDescription``). Raises :class:`~.errors.CollectionNotFound`."""

    async def list(self, name: str) -> list[dict[str, Any]]:
        """The snapshots of ``name``, oldest first. Raises :class:`~.errors.CollectionNotFound` when there is
        neither such a collection nor a snapshot of one."""

    def path(self, name: str, snapshot: str) -> Path:
        """The file of snapshot ``snapshot`` of ``name``. Raises :class:`~.errors.SnapshotNotFound`."""

    async def delete(self, name: str, snapshot: str) -> None:
        """Delete a snapshot. Raises :class:`~.errors.SnapshotNotFound`."""

    async def recover(
        self, name: str, archive: Path, checksum: str | None, vet: Vet | None = None, index: bool = True
    ) -> CollectionHandle:
        """Replace (or create) collection ``name`` with the snapshot file ``archive``; returns the open collection.
        ``vet`` is called with the models the snapshot is bound to before anything is replaced (what it raises
        passes through); ``index`` false: a derived index the archive carries is not read but rebuilt (an untrusted
        file). Raises :class:`~.errors.InvalidCollectionRequest` (bad name, ``invalid_snapshot``,
        ``checksum_mismatch``)."""


def snapshot_store(backend: VectorBackend) -> SnapshotStore:
    """The backend's snapshot store.

    Raises:
        InvalidCollectionRequest: ``unsupported``: the backend keeps no snapshots (milvus).
    """
    store = getattr(backend, "snapshots", None)
    if store is None:
        raise InvalidCollectionRequest(
            "collection snapshots are kept by the embedded backend; Milvus collections are backed up with Milvus's "
            "own tool, milvus-backup (docs/vector-backends.md)",
            code="unsupported",
        )
    return store


def check_name(name: str) -> None:
    """Raises InvalidCollectionRequest (``param`` ``name``) unless ``name`` can name a collection."""
    if not NAME_RE.match(name):
        raise InvalidCollectionRequest(f"collection name {name!r} must match {NAME_RE.pattern}", param="name")


async def detached(coro: Awaitable[T]) -> T:
    """Await ``coro`` as a task that a cancelled caller (client gone, request time budget) does not stop: a snapshot
    or a recovery, once begun, completes (:func:`.completion.to_completion`)."""
    return await to_completion(coro)


async def run_or_accept(coro: Awaitable[T], wait: bool, detach: bool = True) -> tuple[T | None, bool]:
    """``(result, True)`` once ``coro`` completes (:func:`detached` unless ``detach`` is false: ``coro`` then shields
    what must complete itself, and the rest, a download, stops with its caller), or, with ``wait`` false,
    ``(None, False)`` at once with ``coro`` running in the background (:func:`in_background`): the API's
    ``?wait=false``."""
    if wait:
        return (await detached(coro) if detach else await coro), True
    in_background(coro)
    return None, False


def in_background(coro: Awaitable[Any]) -> None:
    """Run ``coro`` as a background task (``wait=false``); a failure is logged."""
    task = asyncio.ensure_future(coro)
    _tasks.add(task)

    def _done(t: asyncio.Task) -> None:
        _tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("snapshot operation failed in the background: %s", t.exception(), exc_info=t.exception())

    task.add_done_callback(_done)


class Recovery:
    """Recovery of collections from snapshots on ``backend`` (module docstring); each recovered collection is handed
    to the :attr:`listeners`.

    No model is loaded on a recovery's behalf: every model the snapshot's vectors are bound to must be loaded
    (exactly: name, version, sha256; and of the snapshot's dimension), else the recovery is refused before the
    collection is touched (:class:`~.errors.ModelUnavailable`, 409). Load it first (``POST /admin/models/.../load``).

    Args:
        backend: the collections' backend (its ``snapshots`` store and ``settings``: the download limits).
        inference: the inference port, asked which models are loaded.
    """

    def __init__(self, backend: VectorBackend, inference: InferencePort) -> None:
        self.backend = backend
        self.inference = inference
        #: awaited with each collection recovered (the re-embedder's ``adopt``)
        self.listeners: list[Callable[[CollectionHandle], Awaitable[None]]] = []

    async def recover(self, name: str, location: str, checksum: str | None, api_key: str | None) -> CollectionHandle:
        """Recover collection ``name`` from the snapshot at ``location`` (:func:`.snapshot_fetch.fetch`, within the
        ``collections_snapshot_*`` limits), then hand it to the listeners. The download is the caller's (cancelled
        with it, its file removed); the recovery proper, once begun, completes (:meth:`recover_file`).

        Errors: those of :func:`snapshot_store`, :func:`.snapshot_fetch.fetch` and :meth:`recover_file`."""
        store = snapshot_store(self.backend)
        check_name(name)  # before a download
        limits = FetchLimits.of(self.backend.settings)
        path, downloaded = await fetch(location, store.directory, limits, api_key)
        return await self.recover_file(name, path, checksum, remove=downloaded)

    async def recover_file(
        self, name: str, path: Path, checksum: str | None, remove: bool, trusted: bool = True
    ) -> CollectionHandle:
        """Recover collection ``name`` from the snapshot file ``path`` (deleted afterwards when ``remove``: a download
        or an upload), then hand it to the listeners; runs to its end whatever the caller does (:func:`detached`).
        An untrusted file (``trusted`` false: an upload) gets its index rebuilt from its store, never read.

        Raises:
            InvalidCollectionRequest: as :meth:`SnapshotStore.recover`.
            ModelUnavailable: a model the snapshot is bound to is not loaded (or not that exact one).
        """
        return await detached(self._recover_file(name, path, checksum, remove, trusted))

    async def _recover_file(
        self, name: str, path: Path, checksum: str | None, remove: bool, trusted: bool
    ) -> CollectionHandle:
        try:
            c = await snapshot_store(self.backend).recover(name, path, checksum, vet=self.vet, index=trusted)
        finally:
            if remove:
                await asyncio.to_thread(path.unlink, True)
        for listener in self.listeners:
            await listener(c)
        return c

    def vet(self, models: list[tuple[dict[str, Any], int]]) -> None:
        """Check that each ``(model record, dimension)`` a snapshot's vectors are bound to is loaded as recorded.

        Raises:
            ModelUnavailable: a model is not loaded, or is loaded with another sha256 or dimension.
        """
        for model, dimension in models:
            ref = ModelRef.from_dict(model)
            try:
                spec = self.inference.loaded(ref.id)
            except (ModelNotFound, ModelNotReady):
                spec = None
            if spec is None or spec.ref.sha256 != ref.sha256 or spec.dimension != dimension:
                raise ModelUnavailable(
                    f"the snapshot's vectors are embedded by model {ref.id} (sha256 {ref.sha256[:12]}..., dimension "
                    f"{dimension}), which is not loaded: a recovery loads no model; an admin loads it first "
                    "(POST /admin/models/{name}/load)"
                )


def clean_downloads(directory: Path) -> None:
    """Remove downloads left by an interrupted recovery (at start)."""
    shutil.rmtree(directory / DOWNLOADS, ignore_errors=True)
