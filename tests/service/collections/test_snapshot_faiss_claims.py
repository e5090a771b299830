"""A FAISS snapshot inside an archive recovered as trusted (an admin's recovery from a ``location``, where the index
is read rather than rebuilt) whose serialized index claims more than it holds (a codes vector of 2^28 floats, a
dimension, a vector count, an id map in a few KB) is refused ``invalid_snapshot`` before FAISS reads it: no memory
grows. Honest snapshots of each index type this service writes pass the same walk. Archive helpers:
tests/service/collections/test_snapshot_hostile.py."""

from __future__ import annotations

import asyncio
import json
import resource
import struct
import zlib

import faiss
import numpy as np
import pytest

from service.collections.embedded.backend import EmbeddedBackend
from service.collections.errors import InvalidCollectionRequest
from service.collections.index import IndexSpec, VectorIndex, index_kinds, normalize_params
from service.collections.index.faiss_claims import UnknownIndexFormat, check_claims
from service.collections.index.registry import get_type
from service.collections.snapshots import Recovery
from tests.service.collections.test_snapshot_hostile import LOADED, D, _faiss_claiming, _members, _tar

pytestmark = pytest.mark.timeout(120)


def _rewrapped(body: bytes, index: bytes) -> bytes:
    """The FAISS snapshot ``body`` (``vector_index``'s wrapper) around another serialized ``index``, its sizes and
    checksum recomputed: only the index's own claims can give it away."""
    hlen = struct.unpack("<Q", body[8:16])[0]
    header = json.loads(body[16 : 16 + hlen])
    tombs = body[16 + hlen : 16 + hlen + 8 * header["n_tombstones"]]
    header["index_bytes"], header["crc32"] = len(index), zlib.crc32(index, zlib.crc32(tombs))
    h = json.dumps(header).encode()
    return body[:8] + struct.pack("<Q", len(h)) + h + tombs + index


def _inner(body: bytes) -> bytes:
    hlen = struct.unpack("<Q", body[8:16])[0]
    tombs = json.loads(body[16 : 16 + hlen])["n_tombstones"]
    return body[16 + hlen + 8 * tombs :]


def test_trusted_recovery_refuses_faiss_claims_the_file_cannot_hold(tmp_path):
    m = _members(tmp_path)
    name = next(n for n in m if n.startswith("index-"))
    inner = bytearray(_inner(m[name]))
    # IxM2 header: fourcc, d (int32), ntotal (int64); the inner IxF* header follows the id map's
    other_d = inner.copy()
    other_d[4:8] = struct.pack("<i", 1 << 20)
    many = inner.copy()
    many[8:16] = struct.pack("<q", 1 << 40)
    ids = inner.copy()
    ids[-8 * 4 : -8 * 3] = struct.pack("<Q", 1 << 36)  # the id map's count: 3 ids, then 3 x 8 bytes; claims 2^36
    lies = {
        "codes": _faiss_claiming(m[name], 2**28),  # 1 GiB of floats
        "dimension": _rewrapped(m[name], bytes(other_d)),
        "ntotal": _rewrapped(m[name], bytes(many)),
        "ids": _rewrapped(m[name], bytes(ids)),
        "trailing": _rewrapped(m[name], bytes(inner) + b"\0" * 64),
    }
    archives = {k: _tar(tmp_path / f"{k}.snapshot", {**m, name: v}) for k, v in lies.items()}

    async def main() -> None:
        b = EmbeddedBackend(tmp_path / "data" / "collections")
        await b.start()
        try:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            for kind, archive in archives.items():
                with pytest.raises(InvalidCollectionRequest) as e:
                    await Recovery(b, LOADED).recover_file("admin", archive, None, remove=False, trusted=True)
                assert e.value.code == "invalid_snapshot", (kind, e.value)
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB
            assert grown < 200 * 1024, grown  # before the walk: FAISS allocated the 1 GiB the codes claimed
            honest = _tar(tmp_path / "honest.snapshot", m)
            c = await Recovery(b, LOADED).recover_file("admin", honest, None, remove=False, trusted=True)
            assert c.count == 3 and c.info()["snapshot_sequence"] > 0  # read, not rebuilt
            lsh = _rewrapped(m[name], faiss.serialize_index(faiss.IndexLSH(D, 16)).tobytes())  # not walked
            other = _tar(tmp_path / "other.snapshot", {**m, name: lsh})
            c = await Recovery(b, LOADED).recover_file("admin", other, None, remove=False, trusted=True)
            assert c.count == 3 and c.info()["snapshot_sequence"] == 0  # not given to FAISS: rebuilt from the store
            assert sorted(p.name for p in b.root.iterdir()) == ["admin"]
        finally:
            await b.close()

    asyncio.run(main())


#: params that train each kind on the 2,000 points below (small lists, few sub-quantizers)
_SMALL = {
    "ivf_pq": {"nlist": 4, "m": 2, "nbits": 4, "min_train_points": 100},
    "ivf_sq": {"nlist": 4},
    "ivf_pq_fs": {"nlist": 4, "min_train_points": 100},
}


@pytest.mark.parametrize("kind", index_kinds())
def test_the_walk_reads_every_index_this_service_writes(kind):
    """Every registered index type, built as the service builds it, empty, untrained and trained, walks to its end."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, D)).astype(np.float32)
    params = {**_SMALL.get(kind, {}), **({"min_train_points": 100} if get_type(kind).trains_on_add else {})}
    spec = IndexSpec(kind, "cosine", normalize_params(kind, {**params}, D), D)
    check_claims(faiss.serialize_index(VectorIndex(spec).index), D)  # empty, untrained
    ids = np.arange(2000, dtype=np.int64)
    sample = x if get_type(kind).train_sample_size(spec, 2000) else None
    built = VectorIndex.build(spec, [(ids[:1500], x[:1500])], train_sample=sample)
    built.remove(ids[:10])
    check_claims(faiss.serialize_index(built.index), D)
    with pytest.raises(UnknownIndexFormat):
        check_claims(faiss.serialize_index(faiss.IndexLSH(D, 16)), D)


def test_a_scalar_quantizer_claiming_another_shape_is_refused():
    """An int8 index whose quantizer claims another dimension, a code size over 4 bytes a dimension or more ranges
    than two a dimension is refused before FAISS reads it."""
    x = np.random.default_rng(0).normal(size=(500, D)).astype(np.float32)
    sq = faiss.IndexScalarQuantizer(D, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    sq.train(x)
    sq.add(x)
    body = bytearray(faiss.serialize_index(sq).tobytes())
    at = 4 + 4 + 8 + 16 + 1 + 4 + 4 + 4 + 4  # fourcc, header, qtype, rangestat, rangestat_arg: then d, code_size
    check_claims(bytes(body), D)
    for offset, value, message in ((0, D + 1, "d="), (8, 4 * D + 1, "code size"), (16, 2 * D + 1, "ranges")):
        lie = body.copy()
        lie[at + offset : at + offset + 8] = struct.pack("<Q", value)
        with pytest.raises(ValueError, match=message):
            check_claims(bytes(lie), D)


def test_fast_scan_block_lists_claiming_other_blocks_are_refused():
    """A fast-scan index's block lists are checked as FAISS lays them out: blocks of 32 vectors of ``16 * M2`` bytes
    a list, each list's codes exactly the blocks of its ids; a list claiming more codes than the file holds, or
    blocks of another size, is refused before FAISS reads it."""
    x = np.random.default_rng(0).normal(size=(2000, D)).astype(np.float32)
    spec = IndexSpec("ivf_pq_fs", "cosine", normalize_params("ivf_pq_fs", _SMALL["ivf_pq_fs"], D), D)
    built = VectorIndex.build(spec, [(np.arange(2000, dtype=np.int64), x)], train_sample=x)
    body = bytearray(faiss.serialize_index(built.index).tobytes())
    check_claims(bytes(body), D)
    at = body.index(b"ilbl") + 4  # nlist, code_size, n_per_block, block_size, then the first list's ids
    for offset, value, message in ((16, 64, "blocks"), (24, 1 << 20, "blocks"), (32, 1 << 40, "ids")):
        lie = body.copy()
        lie[at + offset : at + offset + 8] = struct.pack("<Q", value)
        with pytest.raises(ValueError, match=message):
            check_claims(bytes(lie), D)
