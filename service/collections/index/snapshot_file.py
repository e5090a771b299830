"""The snapshot file of a :class:`~.vector_index.VectorIndex`: what an embedded collection writes so that an open loads
its index instead of rebuilding it from the stored vectors.

Layout: ``EMBSNAP1`` (8 bytes), the header's length (little-endian uint64), a JSON header (``seq``: the last write the
snapshot covers; ``kind``, ``metric``, ``dimension``; ``trained``; ``n_tombstones``; ``index_bytes``; ``crc32`` over
the tombstones then the index), the tombstones (int64 each), then FAISS's serialisation of the index
(``faiss.write_index``, streamed). The header is space-padded to :data:`HEADER_BYTES` (written last, once the
index's size and CRC are known). Written to a temporary file in the same directory, fsynced, renamed over the target and
the directory fsynced, so a crash leaves the old snapshot or the new one.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import faiss
import numpy as np

from artifact_contract.fsio import fsync_dir
from service.collections.index.base import CHUNK_BYTES, IndexSpec, stream_index
from service.collections.index.registry import get_type
from service.collections.index.vector_index import VectorIndex

#: the file's first 8 bytes
SNAP_MAGIC = b"EMBSNAP1"


#: bytes reserved for the JSON header, written (space-padded) once the index's size and CRC are known
HEADER_BYTES = 512


def write_snapshot(index: VectorIndex, path: Path, seq: int) -> int:
    """Write ``index``, its tombstones and ``seq`` (the last write it covers) to ``path`` atomically. FAISS's
    serialisation is streamed into the file (``faiss.PyCallbackIOWriter``), never held whole in memory: at 10M
    int8-coded vectors it is ~3.9 GB, and ``faiss.serialize_index`` grows a buffer to it and copies it out.

    Returns:
        bytes written.
    """
    tomb = index.tombstones().tobytes()
    crc = zlib.crc32(tomb)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    with open(tmp, "wb") as f:

        def put(chunk: bytes) -> None:
            nonlocal crc
            f.write(chunk)
            crc = zlib.crc32(chunk, crc)

        f.write(b" " * (16 + HEADER_BYTES) + tomb)
        size = stream_index(index.index, put)
        header = json.dumps(
            {
                "seq": int(seq),
                "kind": index.spec.kind,
                "metric": index.spec.metric,
                "dimension": index.spec.dimension,
                "trained": index.trained,
                "n_tombstones": len(tomb) // 8,
                "index_bytes": size,
                "crc32": crc,
            }
        ).encode()
        if len(header) > HEADER_BYTES:
            raise ValueError(f"a snapshot header of {len(header)} bytes exceeds {HEADER_BYTES}")
        f.seek(0)
        f.write(SNAP_MAGIC + struct.pack("<Q", HEADER_BYTES) + header.ljust(HEADER_BYTES))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return 16 + HEADER_BYTES + len(tomb) + size


def read_snapshot(path: Path, spec: IndexSpec) -> tuple[VectorIndex, int]:
    """Load a snapshot written by :func:`write_snapshot` (or by its earlier form, whose header was not padded),
    streaming the index from the file into FAISS (``faiss.PyCallbackIOReader``): the file is never held whole in
    memory; its CRC is checked as it is read.

    Returns:
        ``(index, seq)``.

    Raises:
        ValueError: bad magic, a truncated or corrupt file (length or checksum), or a kind/metric/dimension that
            differs from ``spec``.
    """
    with open(path, "rb") as f:
        if f.read(8) != SNAP_MAGIC:
            raise ValueError(f"{path}: not a snapshot")
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        for key in ("kind", "metric", "dimension"):
            if header[key] != getattr(spec, key):
                raise ValueError(
                    f"{path}: snapshot {key} {header[key]!r} differs from the collection's {getattr(spec, key)!r}"
                )
        tomb_bytes = f.read(8 * header["n_tombstones"])
        crc, size = zlib.crc32(tomb_bytes), 0

        def get(n: int) -> bytes:
            nonlocal crc, size
            chunk = f.read(min(n, max(header["index_bytes"] - size, 0)))
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
            return chunk

        try:
            loaded = faiss.read_index(faiss.PyCallbackIOReader(get, CHUNK_BYTES))
        except RuntimeError as e:  # FAISS's reader: a short read or a value it cannot hold
            raise ValueError(f"{path}: truncated or corrupt ({str(e).splitlines()[0][:200]})") from None
        if len(tomb_bytes) != 8 * header["n_tombstones"] or size != header["index_bytes"] or f.read(1):
            raise ValueError(f"{path}: truncated or corrupt (length)")
    if crc != header["crc32"]:
        raise ValueError(f"{path}: truncated or corrupt (checksum mismatch)")
    tomb = np.frombuffer(tomb_bytes, dtype=np.int64)
    index = get_type(spec.kind).loaded(spec, loaded)
    return VectorIndex(spec, index, tomb), int(header["seq"])
