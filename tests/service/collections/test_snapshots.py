"""Collection snapshots of the embedded backend without the service: an archive is the collection as of one write
while writes go on, recovery loads its FAISS snapshot and replays the rest, bad archives are refused, and a
recovery interrupted between its two renames is finished at start (the HTTP routes and qdrant-client:
tests/service/http/qdrant/test_qdrant_clients.py)."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.embedded.archive import extract_archive, list_archives, sha256_of, write_archive
from service.collections.embedded.backend import EmbeddedBackend
from service.collections.errors import CollectionClosed, InvalidCollectionRequest
from service.collections.index import IndexSpec, normalize_params
from service.collections.schema import VectorsConfig
from service.collections.vector_backend import single_config

D = 32
MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, D)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make(path: Path) -> Collection:
    return Collection.create(
        path, VectorsConfig.single(IndexSpec("hnsw", "cosine", normalize_params("hnsw", {"M": 16}, D), D), MODEL)
    )


def test_archive_is_the_collection_as_of_one_write_while_writes_go_on(tmp_path):
    rng = np.random.default_rng(0)
    c = make(tmp_path / "col" / "a")
    X = unit(rng, 3000)
    for s in range(0, 2000, 200):
        c.upsert(list(range(s, s + 200)), [f"t{i}" for i in range(s, s + 200)], [{"i": i} for i in range(s, s + 200)],
                 X[s : s + 200])  # fmt: skip
    c.delete(ids=list(range(0, 100)))
    assert c.snapshot() is not None  # a FAISS snapshot the archive carries; the writes below are replayed over it
    live = set(range(100, 2000))
    states = {c.seq: frozenset(live)}  # the live ids after each write, by its sequence number
    stop, started = threading.Event(), threading.Event()

    def writer() -> None:
        k = 2000
        while not stop.is_set() and k < 3000:
            seq = c.upsert([k, k + 1], ["x", "y"], [{}, {}], X[k : k + 2])
            live.update((k, k + 1))
            states[seq] = frozenset(live)
            _, seq = c.delete(ids=[k - 1900])
            live.discard(k - 1900)
            states[seq] = frozenset(live)
            k += 2
            if k % 20 == 0:
                c.snapshot()  # new FAISS snapshots prune the removals they cover, meanwhile
            if k == 2020:
                started.set()

    t = threading.Thread(target=writer)
    t.start()
    started.wait(30)
    try:
        desc = write_archive(c, tmp_path / "snaps")
    finally:
        stop.set()
        t.join()
    assert desc["checksum"] == sha256_of(tmp_path / "snaps" / desc["name"])
    assert list_archives(tmp_path / "snaps") == [desc]
    manifest = extract_archive(tmp_path / "snaps" / desc["name"], tmp_path / "col" / "b", desc["checksum"])
    r = Collection.open(tmp_path / "col" / "b")
    seq = manifest["sequence"]
    assert seq in states and r.seq == seq and manifest["points"] == r.count == len(states[seq])
    rows = r.scroll(None, 5000)
    assert {p["id"] for p in rows} == states[seq]
    assert r.info()["snapshot_sequence"] > 0  # loaded the carried FAISS snapshot, not a rebuild
    assert r.index.live == r.count
    for i in sorted(states[seq])[::97]:  # every point finds itself, with its text and payload
        h = r.search(X[i : i + 1], 1)[0][0]
        assert h.id == i and h.score > 0.999
    r.close()
    c.close()


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


def test_bad_archives_are_refused(tmp_path):
    rng = np.random.default_rng(1)
    c = make(tmp_path / "col" / "a")
    c.upsert([1, 2], ["a", "b"], [{}, {}], unit(rng, 2))
    desc = write_archive(c, tmp_path / "snaps")
    good = tmp_path / "snaps" / desc["name"]
    with pytest.raises(InvalidCollectionRequest) as e:
        extract_archive(good, tmp_path / "x1", "0" * 64)
    assert e.value.code == "checksum_mismatch"
    with tarfile.open(good) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    bad = {
        "not a tar": tmp_path / "junk.snapshot",
        "path": _tar(tmp_path / "escape.snapshot", {**members, "../evil": b"x"}),
        "no store": _tar(tmp_path / "nostore.snapshot", {"manifest.json": members["manifest.json"]}),
        "damaged store": _tar(tmp_path / "damaged.snapshot", {**members, "points.sqlite3": b"SQLite format 3\0" + bytes(5000)}),
        "format": _tar(tmp_path / "format.snapshot", {**members, "manifest.json": json.dumps({"format": 99}).encode()}),
    }  # fmt: skip
    bad["not a tar"].write_bytes(b"hello" * 1000)
    for i, (what, p) in enumerate(bad.items()):
        with pytest.raises(InvalidCollectionRequest) as e:
            extract_archive(p, tmp_path / f"y{i}")
        assert e.value.code == "invalid_snapshot", what
    assert not (tmp_path / "evil").exists()
    extract_archive(good, tmp_path / "ok")
    assert Collection.open(tmp_path / "ok").count == 2


def test_recovery_replaces_and_an_interrupted_swap_is_finished_at_start(tmp_path):
    rng = np.random.default_rng(2)
    X = unit(rng, 10)

    async def main() -> None:
        b = EmbeddedBackend(tmp_path / "data" / "collections")
        await b.start()
        c = await b.create("docs", single_config("docs", "flat", None, "cosine", MODEL, D))
        await b.run(c.upsert, [1, 2, 3], ["a", "b", "c"], [{}, {}, {}], X[:3])
        desc = await b.snapshots.create("docs")
        await b.run(c.upsert, [4], ["d"], [{}], X[3:4])
        await b.run(c.delete, [1])
        assert (await b.snapshots.list("docs")) == [desc]
        path = b.snapshots.path("docs", desc["name"])
        r = await b.snapshots.recover("docs", path, desc["checksum"])
        assert r is b.get("docs") and r.count == 3 and {p["id"] for p in await b.run(r.scroll, None, 10)} == {1, 2, 3}
        with pytest.raises(CollectionClosed):
            await b.run(c.get, 1)  # the replaced collection is closed
        # a recovery that stopped between its renames: the restored copy is there, the collection is not
        await b.delete("docs")
        assert await b.snapshots.list("docs") == [desc]  # snapshots outlive their collection
        await b.run(extract_archive, path, b.root / ".restored-docs")
        await b.close()
        b2 = EmbeddedBackend(tmp_path / "data" / "collections")
        await b2.start()
        assert b2.get("docs").count == 3
        await b2.close()

    asyncio.run(main())
