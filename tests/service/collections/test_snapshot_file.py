"""The FAISS snapshot file (service/collections/index/snapshot_file.py): an index written by streaming FAISS's
serialisation into the file reads back answering as the original (tombstones and all); a file of the earlier
layout (``faiss.serialize_index``, unpadded header) still reads; a flipped byte, a cut file or another kind is
refused with ValueError, never loaded."""

from __future__ import annotations

import json
import struct
import zlib

import faiss
import numpy as np
import pytest

from service.collections.index import IndexSpec, VectorIndex, normalize_params, read_snapshot, write_snapshot
from service.collections.index.snapshot_file import HEADER_BYTES, SNAP_MAGIC

D = 16


@pytest.fixture(scope="module")
def ivf_sq() -> tuple[VectorIndex, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3000, D)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    spec = IndexSpec("ivf_sq", "cosine", normalize_params("ivf_sq", {"nlist": 16, "nprobe": 16}, D), D)
    vi = VectorIndex.build(spec, [(np.arange(3000, dtype=np.int64), x)], train_sample=x)
    vi.remove(np.arange(0, 3000, 7, dtype=np.int64))
    return vi, x


def test_a_streamed_snapshot_reads_back_as_the_index(ivf_sq, tmp_path):
    vi, x = ivf_sq
    path = tmp_path / "snap.faiss"
    size = write_snapshot(vi, path, seq=41)
    assert size == path.stat().st_size
    assert path.read_bytes()[:8] == SNAP_MAGIC and struct.unpack("<Q", path.read_bytes()[8:16]) == (HEADER_BYTES,)
    got, seq = read_snapshot(path, vi.spec)
    assert seq == 41 and got.trained and got.live == vi.live == 3000 - len(range(0, 3000, 7))
    assert np.array_equal(np.sort(got.tombstones()), np.sort(vi.tombstones()))
    q = x[:20]
    assert np.array_equal(got.search(q, 10, None)[1], vi.search(q, 10, None)[1])
    assert not np.isin(got.search(q, 10, None)[1], np.arange(0, 3000, 7)).any()  # removed stay removed


def test_the_earlier_layout_still_reads(ivf_sq, tmp_path):
    vi, x = ivf_sq
    body, tomb = faiss.serialize_index(vi.index), vi.tombstones()
    header = json.dumps(
        {
            "seq": 9,
            "kind": "ivf_sq",
            "metric": "cosine",
            "dimension": D,
            "trained": True,
            "n_tombstones": len(tomb),
            "index_bytes": len(body),
            "crc32": zlib.crc32(memoryview(body), zlib.crc32(tomb.tobytes())),
        }
    ).encode()
    path = tmp_path / "old.faiss"
    path.write_bytes(SNAP_MAGIC + struct.pack("<Q", len(header)) + header + tomb.tobytes() + body.tobytes())
    got, seq = read_snapshot(path, vi.spec)
    assert seq == 9 and np.array_equal(got.search(x[:5], 10, None)[1], vi.search(x[:5], 10, None)[1])


@pytest.mark.parametrize("damage", ["flip", "cut", "longer", "kind"])
def test_a_damaged_snapshot_is_refused(ivf_sq, tmp_path, damage):
    vi, _ = ivf_sq
    path = tmp_path / "snap.faiss"
    write_snapshot(vi, path, seq=1)
    data = bytearray(path.read_bytes())
    spec = vi.spec
    if damage == "flip":
        data[len(data) // 2] ^= 0x40  # inside the codes: FAISS reads it, the CRC does not match
    elif damage == "cut":
        del data[len(data) - 1000 :]
    elif damage == "longer":
        data += b"\0" * 8
    else:
        spec = IndexSpec("ivf_pq", spec.metric, normalize_params("ivf_pq", {"nlist": 16, "m": 4}, D), D)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        read_snapshot(path, spec)
