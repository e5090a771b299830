"""The embedded backend's collection snapshots (:class:`~..snapshots.SnapshotStore`): archives of
:mod:`.archive` under ``<snapshots dir>/<collection>/``, and recovery by an atomic swap of the collection directory.

Recovery unpacks the archive into ``<collections>/.restoring-<name>-…`` (a hidden directory: removed at start if
unfinished), renames it ``.restored-<name>`` once complete and fsynced, then, under the backend's lock, closes the
collection it replaces (waiting for its running operations), moves that aside and renames the restored one into
place. A crash between those two renames leaves ``.restored-<name>`` and no ``<name>``: the backend's start finishes
the swap (:func:`finish_swaps`), so a crash never loses both.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from artifact_contract.fsio import fsync_dir
from service.collections.aliases import Aliases
from service.collections.embedded.archive import NAME_RE as ARCHIVE_RE
from service.collections.embedded.archive import extract_archive, list_archives, write_archive
from service.collections.embedded.archive_checks import invalid, store_models
from service.collections.embedded.collection import Collection
from service.collections.errors import CollectionExists, CollectionNotFound, InvalidCollectionRequest, SnapshotNotFound
from service.collections.snapshots import Vet, clean_downloads
from service.collections.vector_backend import NAME_RE

RESTORED = ".restored-"
T = TypeVar("T")


class SnapshotHost(Protocol):
    """What the snapshots use of their backend (:class:`~.backend.EmbeddedBackend`): its directory, aliases and
    open collections, its thread pool, and the swap of a recovered collection into place under its lock."""

    root: Path
    aliases: Aliases
    collections: dict[str, Collection]

    def get(self, name: str) -> Collection:
        """The open collection ``name`` (or that the alias ``name`` names). Raises CollectionNotFound."""

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run blocking ``fn(*args, **kw)`` on the backend's thread pool."""

    async def swap_in(self, name: str, ready: Path) -> Collection:
        """Make the collection directory ``ready`` collection ``name``, replacing the open one; returns it open."""


def finish_swaps(root: Path) -> None:
    """At start, before hidden directories are removed: a ``.restored-<name>`` whose ``<name>`` is missing was
    interrupted between the two renames of a recovery; rename it into place."""
    for p in root.iterdir():
        if p.name.startswith(RESTORED) and not (root / p.name[len(RESTORED) :]).exists():
            os.rename(p, root / p.name[len(RESTORED) :])
            fsync_dir(root)


class EmbeddedSnapshots:
    """Snapshots of an :class:`~.backend.EmbeddedBackend`'s collections.

    Args:
        backend: the backend (its collections, aliases, thread pool and swap: :class:`SnapshotHost`).
        directory: the snapshots directory (a folder per collection inside).
    """

    def __init__(self, backend: SnapshotHost, directory: Path) -> None:
        self.backend = backend
        self.directory = Path(directory)
        self._creating: dict[str, asyncio.Lock] = {}

    def start(self) -> None:
        """Remove what an interrupted snapshot or download left (blocking)."""
        if self.directory.is_dir():
            clean_downloads(self.directory)
            for d in self.directory.iterdir():
                if d.is_dir():
                    for p in d.glob(".creating-*"):
                        shutil.rmtree(p, ignore_errors=True)

    def _dir(self, name: str) -> Path:
        """The folder of collection ``name``'s snapshots (an alias: of the collection it names)."""
        if not NAME_RE.match(name):
            raise CollectionNotFound(f"collection {name!r} not found")
        return self.directory / (self.backend.aliases.resolve(name) or name)

    async def create(self, name: str) -> dict[str, Any]:
        """Snapshot collection ``name`` (one at a time per collection). Raises CollectionNotFound."""
        lock = self._creating.setdefault(name, asyncio.Lock())
        async with lock:
            c = self.backend.get(name)
            return await self.backend.run(write_archive, c, self._dir(name))

    async def list(self, name: str) -> list[dict[str, Any]]:
        """The snapshots of ``name``, oldest first. Raises CollectionNotFound: no such collection and no snapshot."""
        d = self._dir(name)
        if d.name not in self.backend.collections and not d.is_dir():
            raise CollectionNotFound(f"collection {name!r} not found")
        return await self.backend.run(list_archives, d)

    def path(self, name: str, snapshot: str) -> Path:
        """The file of ``snapshot``. Raises SnapshotNotFound."""
        p = self._dir(name) / snapshot
        if not ARCHIVE_RE.match(snapshot) or not p.is_file():
            raise SnapshotNotFound(f"collection {name!r} has no snapshot {snapshot!r}")
        return p

    async def delete(self, name: str, snapshot: str) -> None:
        """Delete ``snapshot`` and its checksum. Raises SnapshotNotFound."""
        p = self.path(name, snapshot)

        def _rm() -> None:
            p.unlink(missing_ok=True)
            p.with_name(p.name + ".checksum").unlink(missing_ok=True)
            fsync_dir(p.parent)

        await self.backend.run(_rm)

    async def recover(
        self, name: str, archive: Path, checksum: str | None, vet: Vet | None = None, index: bool = True
    ) -> Collection:
        """Replace or create collection ``name`` from ``archive`` (see the module docstring); returns it open. ``vet``
        is called with the models the unpacked store is bound to (:func:`.archive_checks.store_models`) before
        anything is replaced; ``index`` false leaves the archive's FAISS snapshot out (:func:`.archive.extract_archive`:
        an untrusted upload). Whatever fails, nothing of the archive is left behind (no staging, no ``.failed-*``
        copy).

        Raises:
            InvalidCollectionRequest: a bad name, ``invalid_snapshot`` (also: a store that passes the checks but
                does not open; the collection it was to replace stays) or ``checksum_mismatch``; what ``vet``
                raises.
        """
        if not NAME_RE.match(name):
            raise InvalidCollectionRequest(f"collection name {name!r} must match {NAME_RE.pattern}", param="name")
        b = self.backend
        if b.aliases.resolve(name):
            raise CollectionExists(f"{name!r} is an alias; recover into a collection's own name", param="name")
        staging = b.root / f".restoring-{name}-{os.getpid()}-{time.monotonic_ns()}"
        ready = b.root / f"{RESTORED}{name}"
        try:
            await b.run(extract_archive, archive, staging, checksum, index)
            models = await b.run(store_models, staging)
            if vet is not None:
                vet(models)
            try:
                await b.run(os.rename, staging, ready)  # fails while another recovery of name is past this step
            except OSError as e:
                raise InvalidCollectionRequest(f"collection {name!r} is being recovered already", param="name") from e
        finally:
            await b.run(shutil.rmtree, staging, True)
        try:
            return await b.swap_in(name, ready)
        except Exception as e:
            await b.run(_remove_failed, b.root, name)
            raise invalid(f"the snapshot's store does not open ({type(e).__name__}); nothing was replaced") from None


def _remove_failed(root: Path, name: str) -> None:
    """Remove the copies a recovery of ``name`` that did not open left (``.failed-<name>-<ns>``, and a ``.restored-``
    directory the swap did not take)."""
    prefix = f".failed-{name}-"
    for p in root.iterdir():
        if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit():
            shutil.rmtree(p, ignore_errors=True)
    shutil.rmtree(root / f"{RESTORED}{name}", ignore_errors=True)
