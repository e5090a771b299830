"""Collection snapshots: a backend's optional capability (:class:`SnapshotStore`) and the recovery policy over it.

A snapshot is one file per collection and write (the embedded backend's format: :mod:`.embedded.archive`), listed,
downloaded and deleted by name, kept under the snapshots directory (``collections_snapshots_dir``, default
``<data_dir>/snapshots``) in a folder per collection, and not deleted with the collection (a deleted collection can
be recovered from its snapshots). Recovery (Qdrant's ``PUT /collections/{name}/snapshots/recover``,
https://api.qdrant.tech/api-reference/snapshots/recover-from-snapshot) replaces the collection of that name, or
creates it, from a snapshot named by location: ``file://`` inside the snapshots directory, or ``http(s)://`` (another
server's download URL: how a collection moves between machines), or uploaded (``POST .../snapshots/upload``, a
multipart form whose ``snapshot`` field is the file, streamed to disk). The recovered collection is then handed to the
:attr:`Recovery.listeners` (the re-embedder: its model is loaded and, if it is not the active
one, the collection is re-embedded towards the active model, as at start).

The milvus backend has no snapshots (Milvus's own tool is ``milvus-backup``): asking answers 422 ``unsupported``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import httpx

from service.collections.errors import InvalidCollectionRequest
from service.collections.vector_backend import NAME_RE, CollectionHandle, VectorBackend

T = TypeVar("T")
log = logging.getLogger("service.collections")
DOWNLOADS = ".downloads"  # under the snapshots directory: snapshots being fetched from a URL
_tasks: set[asyncio.Task] = set()


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

    async def recover(self, name: str, archive: Path, checksum: str | None) -> CollectionHandle:
        """Replace (or create) collection ``name`` with the snapshot file ``archive``; returns the open collection.
        Raises :class:`~.errors.InvalidCollectionRequest` (bad name, ``invalid_snapshot``, ``checksum_mismatch``)."""


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
    or a recovery, once begun, completes."""
    task = asyncio.ensure_future(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return await asyncio.shield(task)


async def run_or_accept(coro: Awaitable[T], wait: bool) -> tuple[T | None, bool]:
    """``(result, True)`` once ``coro`` completes (:func:`detached`), or, with ``wait`` false, ``(None, False)`` at once
    with ``coro`` running in the background (:func:`in_background`): the API's ``?wait=false``."""
    if wait:
        return await detached(coro), True
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


async def fetch(location: str, directory: Path, api_key: str | None = None) -> tuple[Path, bool]:
    """The local file of snapshot ``location``: ``(path, downloaded)``; a downloaded file is the caller's to delete.

    ``file:///...`` must lie inside ``directory`` (the snapshots directory, as Qdrant requires); ``http(s)://...`` is
    downloaded, streaming, into ``directory/.downloads`` (with ``api-key: api_key`` when given: Qdrant's header).

    Raises:
        InvalidCollectionRequest: ``invalid_value`` (another scheme; a path outside ``directory`` or missing) or
            ``snapshot_unreachable`` (the download failed or answered other than 200).
    """
    u = urlsplit(location)
    if u.scheme == "file":
        root = directory.resolve()
        p = Path(unquote(u.path)).resolve()
        if not p.is_relative_to(root):
            raise InvalidCollectionRequest(f"a file location must lie inside {root}", param="location")
        if not p.is_file():
            raise InvalidCollectionRequest(f"no snapshot file at {p}", param="location")
        return p, False
    if u.scheme not in ("http", "https"):
        raise InvalidCollectionRequest("location must be a file://, http:// or https:// URL", param="location")
    dest = download_path(directory)
    headers = {"api-key": api_key} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0), follow_redirects=True) as client:
            async with client.stream("GET", location, headers=headers) as r:
                if r.status_code != 200:
                    raise InvalidCollectionRequest(
                        f"GET {location} answered {r.status_code}", param="location", code="snapshot_unreachable"
                    )
                with open(dest, "wb") as f:
                    async for chunk in r.aiter_bytes(1 << 20):
                        await asyncio.to_thread(f.write, chunk)
    except httpx.HTTPError as e:
        dest.unlink(missing_ok=True)
        raise InvalidCollectionRequest(
            f"GET {location} failed: {e}", param="location", code="snapshot_unreachable"
        ) from e
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return dest, True


class Recovery:
    """Recovery of collections from snapshots on ``backend`` (module docstring); each recovered collection is handed
    to the :attr:`listeners`."""

    def __init__(self, backend: VectorBackend) -> None:
        self.backend = backend
        #: awaited with each collection recovered (the re-embedder's ``adopt``)
        self.listeners: list[Callable[[CollectionHandle], Awaitable[None]]] = []

    async def recover(self, name: str, location: str, checksum: str | None, api_key: str | None) -> CollectionHandle:
        """Recover collection ``name`` from the snapshot at ``location`` (:func:`fetch`), then hand it to the
        listeners. Errors: those of :func:`snapshot_store`, :func:`fetch` and :meth:`SnapshotStore.recover`."""
        store = snapshot_store(self.backend)
        check_name(name)  # before a download
        path, downloaded = await fetch(location, store.directory, api_key)
        return await self.recover_file(name, path, checksum, remove=downloaded)

    async def recover_file(self, name: str, path: Path, checksum: str | None, remove: bool) -> CollectionHandle:
        """Recover collection ``name`` from the snapshot file ``path`` (deleted afterwards when ``remove``: a download
        or an upload), then hand it to the listeners. Errors: those of :meth:`SnapshotStore.recover`."""
        try:
            c = await snapshot_store(self.backend).recover(name, path, checksum)
        finally:
            if remove:
                await asyncio.to_thread(path.unlink, True)
        for listener in self.listeners:
            await listener(c)
        return c


def download_path(directory: Path) -> Path:
    """A fresh file name for a snapshot being received (downloaded or uploaded), in ``directory/.downloads``."""
    dest = directory / DOWNLOADS / f"{uuid.uuid4().hex}.snapshot"
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest


def clean_downloads(directory: Path) -> None:
    """Remove downloads left by an interrupted recovery (at start)."""
    shutil.rmtree(directory / DOWNLOADS, ignore_errors=True)
