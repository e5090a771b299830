"""The snapshot file of a :class:`~.vector_index.VectorIndex`: what an embedded collection writes so that an open loads
its index instead of rebuilding it from the stored vectors.

Layout: ``EMBSNAP1`` (8 bytes), the header's length (little-endian uint64), a JSON header (``seq``: the last write the
snapshot covers; ``kind``, ``metric``, ``dimension``; ``trained``; ``n_tombstones``; ``index_bytes``; ``crc32`` over
the tombstones then the index), the tombstones (int64 each), then FAISS's serialisation of the index
(``faiss.serialize_index``). Written to a temporary file in the same directory, fsynced, renamed over the target and
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
from service.collections.index.base import IndexSpec
from service.collections.index.registry import get_type
from service.collections.index.vector_index import VectorIndex

#: the file's first 8 bytes
SNAP_MAGIC = b"EMBSNAP1"


def write_snapshot(index: VectorIndex, path: Path, seq: int) -> int:
    """Write ``index``, its tombstones and ``seq`` (the last write it covers) to ``path`` atomically.

    Returns:
        bytes written.
    """
    body = faiss.serialize_index(index.index)
    tomb = index.tombstones()
    header = json.dumps(
        {
            "seq": int(seq),
            "kind": index.spec.kind,
            "metric": index.spec.metric,
            "dimension": index.spec.dimension,
            "trained": index.trained,
            "n_tombstones": int(len(tomb)),
            "index_bytes": int(len(body)),
            "crc32": zlib.crc32(memoryview(body), zlib.crc32(tomb.tobytes())),
        }
    ).encode()
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(SNAP_MAGIC + struct.pack("<Q", len(header)) + header)
        f.write(tomb.tobytes())
        f.write(memoryview(body))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return len(header) + len(tomb) * 8 + len(body) + 16


def read_snapshot(path: Path, spec: IndexSpec) -> tuple[VectorIndex, int]:
    """Load a snapshot written by :func:`write_snapshot`.

    Returns:
        ``(index, seq)``.

    Raises:
        ValueError: bad magic, checksum, or a kind/metric/dimension that differs from ``spec``.
    """
    with open(path, "rb") as f:
        if f.read(8) != SNAP_MAGIC:
            raise ValueError(f"{path}: not a snapshot")
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        tomb = np.frombuffer(f.read(8 * header["n_tombstones"]), dtype=np.int64)
        body = np.frombuffer(f.read(), dtype=np.uint8)
    if (
        len(body) != header["index_bytes"]
        or zlib.crc32(memoryview(body), zlib.crc32(tomb.tobytes())) != header["crc32"]
    ):
        raise ValueError(f"{path}: truncated or corrupt (checksum mismatch)")
    for key in ("kind", "metric", "dimension"):
        if header[key] != getattr(spec, key):
            raise ValueError(
                f"{path}: snapshot {key} {header[key]!r} differs from the collection's {getattr(spec, key)!r}"
            )
    index = get_type(spec.kind).loaded(spec, faiss.deserialize_index(body))
    return VectorIndex(spec, index, tomb), int(header["seq"])
