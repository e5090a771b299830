"""The checks an archive from outside passes before anything in it is believed (an upload, a download: hostile input).

Every size an archive declares is checked against the bytes it really holds before anything is read or allocated:
a tar member's size against the archive's length (a truncated member, or a header declaring gigabytes in a small
file, is refused), sparse members are refused (they would be written out at their declared size), reads from the
archive never ask for more than what is left of it, the manifest is bounded in size and nesting, and a FAISS
snapshot's header (its length, its tombstone count, its index length: ``service.collections.index.vector_index``'s
format) must add up to the file's real size, and the FAISS index inside must claim no more than it holds. The models the store's vectors are bound to are read back from the
store itself (not the manifest), so a recovery can refuse a model that is not loaded.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import sqlite3
import struct
import tarfile
from pathlib import Path
from typing import Any, BinaryIO

from service.collections.embedded.store.files import DB_FILE, vectors_from_meta
from service.collections.errors import InvalidCollectionRequest
from service.collections.index.faiss_claims import UnknownIndexFormat, check_claims
from service.collections.index.snapshot_file import SNAP_MAGIC
from service.collections.schema import index_spec

MAX_MANIFEST_BYTES = 1 << 20
MAX_INDEX_HEADER_BYTES = 1 << 16
MAX_DIMENSION = 65536  # as a new collection's vectors (Qdrant's limit)


def invalid(message: str, code: str = "invalid_snapshot") -> InvalidCollectionRequest:
    """The error of an archive that is refused (``param`` ``location``)."""
    return InvalidCollectionRequest(message, param="location", code=code)


class _Clamped(io.RawIOBase):
    """A read-only view of a file of ``size`` bytes whose reads never ask for more than what is left of it (a header
    declaring a huge extended-header length allocates nothing)."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.f.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.f.seek(offset, whence)

    def read(self, n: int | None = -1) -> bytes:
        left = max(0, self.size - self.f.tell())
        return self.f.read(left if n is None or n < 0 else min(n, left))

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.f.close()
        super().close()


def open_tar(path: Path) -> tarfile.TarFile:
    """The archive at ``path`` opened for reading through :class:`_Clamped`.

    Raises:
        InvalidCollectionRequest: ``invalid_snapshot``: not a tar archive.
    """
    f = open(path, "rb")
    try:
        return tarfile.open(fileobj=_Clamped(f, os.fstat(f.fileno()).st_size), mode="r:")
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        f.close()
        raise invalid(f"not a collection snapshot (a tar archive): {e}") from None


def check_member(m: tarfile.TarInfo, archive_size: int) -> None:
    """Refuse a member that is sparse or declares more bytes than the archive holds after its header.

    Raises:
        InvalidCollectionRequest: ``invalid_snapshot``.
    """
    if m.issparse():
        raise invalid(f"member {m.name!r} is a sparse file")
    if m.size < 0 or m.offset_data + m.size > archive_size:
        raise invalid(f"member {m.name!r} declares {m.size} bytes, more than the archive holds (truncated?)")


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest file at ``path``: at most :data:`MAX_MANIFEST_BYTES`, a JSON object.

    Raises:
        InvalidCollectionRequest: ``invalid_snapshot``: too large, not JSON, nested too deep, not an object.
    """
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise invalid(f"the snapshot's manifest is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:
        raise invalid(f"the snapshot's manifest is not JSON: {type(e).__name__}") from None
    if not isinstance(manifest, dict):
        raise invalid("the snapshot's manifest is not a JSON object")
    return manifest


def check_index_file(path: Path) -> None:
    """Check that a FAISS snapshot's header adds up to the file's real size (magic, header length, header JSON,
    ``16 + header + 8 x n_tombstones + index_bytes`` equal to the file's size), then that the serialized index's
    own claims (vector counts, list counts, dimensions) fit the bytes it holds
    (:func:`~..index.faiss_claims.check_claims`), read from a map of the file: FAISS's reader never sees a count
    the file cannot back. A FAISS index of a structure those checks do not read is removed: the collection then
    rebuilds its index from the store, as for an upload.

    Raises:
        InvalidCollectionRequest: ``invalid_snapshot``.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(16)
        if len(head) < 16 or head[:8] != SNAP_MAGIC:
            raise invalid(f"{path.name} is not a FAISS snapshot")
        (hlen,) = struct.unpack("<Q", head[8:])
        if hlen > min(MAX_INDEX_HEADER_BYTES, size - 16):
            raise invalid(f"{path.name} declares a {hlen}-byte header in a {size}-byte file")
        try:
            header = json.loads(f.read(hlen))
            tombs, body, dim = int(header["n_tombstones"]), int(header["index_bytes"]), header["dimension"]
        except (ValueError, RecursionError, KeyError, TypeError, OverflowError) as e:
            raise invalid(f"{path.name} has an unreadable header: {type(e).__name__}") from None
        if tombs < 0 or body < 0 or 16 + hlen + 8 * tombs + body != size:
            raise invalid(f"{path.name} declares {tombs} tombstones and {body} index bytes; the file has {size} bytes")
        if type(dim) is not int or not 1 <= dim <= MAX_DIMENSION:
            raise invalid(f"{path.name} declares dimension {str(dim)[:20]}")
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                check_claims(m, dim, size - body)
        except UnknownIndexFormat:
            unknown = True
        except (ValueError, struct.error) as e:
            raise invalid(f"{path.name}: {e}") from None
        else:
            unknown = False
    if unknown:
        path.unlink()


def store_models(directory: Path) -> list[tuple[dict[str, Any], int]]:
    """``[(model record, dimension)]`` of the model-bound vectors of the store in ``directory`` (as its ``meta``
    table records them; empty without one), once every vector's index type, params, metric and dimension passed the
    checks of a new collection's (:func:`~..schema.index_spec`: no index sized beyond what a create allows is built
    from a snapshot).

    Raises:
        InvalidCollectionRequest: ``invalid_snapshot``: the store's vectors cannot be read or are not valid.
    """
    conn = sqlite3.connect(directory / DB_FILE)
    try:
        meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
        vectors = vectors_from_meta(meta)
        out = []
        for v in vectors.dense.values():
            if not 1 <= v.spec.dimension <= MAX_DIMENSION:
                raise ValueError(f"dimension {v.spec.dimension} is not in [1, {MAX_DIMENSION}]")
            index_spec(v.spec.kind, v.spec.params, v.spec.metric, v.spec.dimension, "params")  # in a create's range
            if v.model is not None:
                model = {k: v.model[k] for k in ("name", "version", "sha256")}
                if not all(isinstance(x, str) for x in model.values()):
                    raise TypeError("a model record holds a non-string")
                out.append((model, int(v.spec.dimension)))
        return out
    except InvalidCollectionRequest as e:
        raise invalid(f"the snapshot's store records an invalid index: {e}") from None
    except (sqlite3.Error, ValueError, RecursionError, KeyError, TypeError, AttributeError, OverflowError) as e:
        raise invalid(f"the snapshot's store records unreadable vectors: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
