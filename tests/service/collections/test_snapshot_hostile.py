"""Hostile snapshots against the core, without the service: archives whose declared sizes lie (a member, a sparse
member, an extended header, a FAISS snapshot's header), truncated or nested too deep; a store bound to a model that
is not loaded; a store that passes the checks but does not open; a create that fails; and downloads that are too
large, encoded, too slow, abandoned, redirected or unreachable. Each is refused with ``invalid_snapshot`` (or
``snapshot_unreachable``, ``model_unavailable``) without allocating or writing what it declares, and leaves no file
behind. The HTTP routes: tests/service/http/test_snapshot_routes_hostile.py."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import resource
import sqlite3
import struct
import tarfile
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.embedded.archive import extract_archive, write_archive
from service.collections.embedded.backend import EmbeddedBackend
from service.collections.errors import CollectionExists, InvalidCollectionRequest, ModelNotFound, ModelUnavailable
from service.collections.ports import ModelRef, ModelSpec
from service.collections.snapshot_fetch import DOWNLOADS, UNREACHABLE, FetchLimits, fetch, local_file
from service.collections.snapshots import Recovery
from service.collections.vector_backend import single_config

pytestmark = pytest.mark.timeout(120)

D = 8
MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}


class Inference:
    """The inference port as the recovery sees it: ``loaded`` models only."""

    def __init__(self, models: dict[str, ModelSpec]) -> None:
        self.models = models
        self.loads: list[str] = []

    def loaded(self, model_id: str) -> ModelSpec:
        if model_id not in self.models:
            raise ModelNotFound(f"model {model_id} is not loaded")
        return self.models[model_id]

    async def load(self, model: ModelRef) -> None:  # never called by a recovery
        self.loads.append(model.id)


LOADED = Inference({"test:1": ModelSpec(ModelRef("test", "1", "0" * 64), D)})


def _members(tmp_path: Path) -> dict[str, bytes]:
    """The members of a real archive of a small flat collection (a FAISS snapshot included)."""
    c = Collection.create(tmp_path / "src" / "a", single_config("a", "flat", None, "cosine", MODEL, D))
    c.upsert([1, 2, 3], ["a", "b", "c"], [{}, {}, {}], np.eye(3, D, dtype=np.float32))
    desc = write_archive(c, tmp_path / "snaps")
    c.close()
    with tarfile.open(tmp_path / "snaps" / desc["name"]) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def _tar(path: Path, members: dict[str, bytes], fmt: int = tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return path


def _refused(path: Path, dest: Path) -> InvalidCollectionRequest:
    with pytest.raises(InvalidCollectionRequest) as e:
        extract_archive(path, dest)
    assert e.value.code == "invalid_snapshot", e.value
    return e.value


def _written(d: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in d.rglob("*") if p.is_file()) if d.exists() else 0


def test_declared_sizes_are_checked_against_the_real_size(tmp_path):
    m = _members(tmp_path)
    index = next(n for n in m if n.startswith("index-"))
    # a member header declaring 2 GiB in a file of a few KB (the data cut short)
    big = tmp_path / "big.snapshot"
    with open(big, "wb") as f:
        info = tarfile.TarInfo("points.sqlite3")
        info.size = 2 * 2**30
        f.write(info.tobuf(tarfile.USTAR_FORMAT) + m["points.sqlite3"][:4096])
    assert "declares" in str(_refused(big, tmp_path / "x1"))
    # truncated: the archive cut inside the store
    whole = _tar(tmp_path / "whole.snapshot", m).read_bytes()
    (tmp_path / "cut.snapshot").write_bytes(whole[: len(whole) // 2])
    _refused(tmp_path / "cut.snapshot", tmp_path / "x2")
    # a sparse store declaring 64 MiB of holes: refused before a byte of it is written
    sparse = tmp_path / "sparse.snapshot"
    with tarfile.open(sparse, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("points.sqlite3")
        info.size = 512
        size = str(64 * 2**20)
        info.pax_headers = {
            "GNU.sparse.size": size,
            "GNU.sparse.numblocks": "1",
            "GNU.sparse.offset": str(64 * 2**20 - 512),
            "GNU.sparse.numbytes": "512",
        }  # noqa: E501
        tar.addfile(info, io.BytesIO(b"\1" * 512))
    _refused(sparse, tmp_path / "x3")
    assert _written(tmp_path / "x3") < 2**20
    # an extended (pax) header declaring 2 GiB: nothing of that size is allocated
    pax = tmp_path / "pax.snapshot"
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, 2 * 2**30
    pax.write_bytes(info.tobuf(tarfile.USTAR_FORMAT) + b"30 path=points.sqlite3\n" + bytes(1000))
    tracemalloc.start()
    try:
        _refused(pax, tmp_path / "x4")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    # a FAISS snapshot whose header claims 2^28 tombstones (2 GiB) in a few KB
    body = m[index]
    hlen = struct.unpack("<Q", body[8:16])[0]
    header = json.loads(body[16 : 16 + hlen])
    header["n_tombstones"] = 2**28
    h = json.dumps(header).encode()
    lying = {**m, index: body[:8] + struct.pack("<Q", len(h)) + h + body[16 + hlen :]}
    assert "tombstones" in str(_refused(_tar(tmp_path / "faiss.snapshot", lying), tmp_path / "x5"))
    # a manifest nested 100,000 deep, and one too large
    deep = {**m, "manifest.json": b"[" * 100_000 + b"]" * 100_000}
    _refused(_tar(tmp_path / "deep.snapshot", deep), tmp_path / "x6")
    huge = {**m, "manifest.json": b'{"format": 1, "pad": "' + b"x" * (2 * 2**20) + b'"}'}
    _refused(_tar(tmp_path / "huge.snapshot", huge), tmp_path / "x7")
    extract_archive(_tar(tmp_path / "good.snapshot", m), tmp_path / "ok")  # the honest archive still passes


def _store_with(members: dict[str, bytes], tmp: Path, sql: str = "", **meta: object) -> dict[str, bytes]:
    """``members`` with the store's ``meta`` rows replaced by ``meta`` (JSON values) and ``sql`` run on it."""
    db = tmp / "edit.sqlite3"
    db.write_bytes(members["points.sqlite3"])
    conn = sqlite3.connect(db)
    with conn:
        for k, v in meta.items():
            conn.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps(v), k))
    if sql:
        conn.executescript(sql)
    conn.close()
    out = {**members, "points.sqlite3": db.read_bytes()}
    db.unlink()
    return out


def test_recovery_loads_no_model_and_a_store_that_does_not_open_leaves_nothing(tmp_path):
    m = _members(tmp_path)
    db = tmp_path / "read.sqlite3"
    db.write_bytes(m["points.sqlite3"])
    rows = {k: json.loads(v) for k, v in sqlite3.connect(db).execute("SELECT key, value FROM meta")}
    other = {"name": "another-artifact", "version": "7", "sha256": "1" * 64}
    vectors = json.loads(json.dumps(rows["vectors"]))
    vectors["dense"][""]["model"] = other
    foreign = _tar(tmp_path / "foreign.snapshot", _store_with(m, tmp_path, model=other, vectors=vectors))
    vectors["dense"][""]["index"] = "no-such-index"
    broken_cfg = {**rows["config"], "index": "no-such-index"}
    broken = _tar(tmp_path / "broken.snapshot", _store_with(m, tmp_path, config=broken_cfg, vectors=vectors))
    unopenable = _tar(tmp_path / "unopenable.snapshot", _store_with(m, tmp_path, sql="DROP TABLE points;"))
    good = _tar(tmp_path / "good.snapshot", m)

    async def main() -> None:
        b = EmbeddedBackend(tmp_path / "data" / "collections")
        await b.start()
        try:
            inference = Inference(dict(LOADED.models))
            recovery = Recovery(b, inference)
            recovery.listeners.append(lambda c: inference.load(ModelRef.from_dict(c.model)))
            c = await recovery.recover_file("docs", good, None, remove=False)
            assert c.count == 3
            with pytest.raises(ModelUnavailable):  # bound to a model that is not loaded: refused, nothing loaded
                await recovery.recover_file("docs", foreign, None, remove=False)
            with pytest.raises(ModelUnavailable):  # the same name and version, another sha256
                await Recovery(b, Inference({"test:1": ModelSpec(ModelRef("test", "1", "f" * 64), D)})).recover_file(
                    "docs", good, None, remove=False
                )
            with pytest.raises(ModelUnavailable):  # loaded with another dimension
                await Recovery(
                    b, Inference({"test:1": ModelSpec(ModelRef("test", "1", "0" * 64), D + 1)})
                ).recover_file("docs", good, None, remove=False)
            assert inference.loads == ["test:1"]  # the one good recovery's listener only
            for archive in (broken, unopenable):  # an index no create would make; a store that does not open
                with pytest.raises(InvalidCollectionRequest) as e:
                    await recovery.recover_file("docs", archive, None, remove=False)
                assert e.value.code == "invalid_snapshot"
                with pytest.raises(InvalidCollectionRequest):
                    await recovery.recover_file("fresh", archive, None, remove=False)
            assert b.get("docs").count == 3 and "fresh" not in b.collections  # the one replaced stays
            assert sorted(p.name for p in b.root.iterdir()) == ["docs"]  # no .failed-*, .restoring-*, .restored-*
        finally:
            await b.close()

    asyncio.run(main())


def _faiss_claiming(body: bytes, floats: int) -> bytes:
    """A FAISS snapshot (``vector_index``'s wrapper, checksums recomputed) whose flat index's inner codes vector
    claims ``floats`` floats: its sizes add up, only FAISS's reader would believe the claim."""
    hlen = struct.unpack("<Q", body[8:16])[0]
    header = json.loads(body[16 : 16 + hlen])
    tombs = body[16 + hlen : 16 + hlen + 8 * header["n_tombstones"]]
    index = bytearray(body[16 + hlen + len(tombs) :])
    at = index.index(struct.pack("<Q", 3 * D), index.index(b"IxF"))
    index[at : at + 8] = struct.pack("<Q", floats)
    header["crc32"] = zlib.crc32(bytes(index), zlib.crc32(tombs))
    h = json.dumps(header).encode()
    return body[:8] + struct.pack("<Q", len(h)) + h + tombs + bytes(index)


def test_an_uploaded_faiss_snapshot_never_reaches_faiss(tmp_path):
    m = _members(tmp_path)
    index = next(n for n in m if n.startswith("index-"))
    lying = _tar(tmp_path / "lying.snapshot", {**m, index: _faiss_claiming(m[index], 2**28)})  # 1 GiB

    async def main() -> None:
        b = EmbeddedBackend(tmp_path / "data" / "collections")
        await b.start()
        try:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            c = await Recovery(b, LOADED).recover_file("up", lying, None, remove=False, trusted=False)
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB
            assert c.count == 3 and c.info()["snapshot_sequence"] == 0  # rebuilt from the store, not read
            assert grown < 300 * 1024, grown
        finally:
            await b.close()

    asyncio.run(main())


def test_a_create_that_fails_frees_its_name(tmp_path, monkeypatch):
    async def main() -> None:
        b = EmbeddedBackend(tmp_path / "collections")
        await b.start()
        try:
            real = Collection.open

            def failing(path, **kw):
                raise OSError("disk full (simulated)")

            monkeypatch.setattr(Collection, "open", failing)
            with pytest.raises(OSError):
                await b.create("docs", single_config("docs", "flat", None, "cosine", MODEL, D))
            monkeypatch.setattr(Collection, "open", real)
            assert not (b.root / "docs").exists()
            c = await b.create("docs", single_config("docs", "flat", None, "cosine", MODEL, D))
            assert c.count == 0
            with pytest.raises(CollectionExists):
                await b.create("docs", single_config("docs", "flat", None, "cosine", MODEL, D))
        finally:
            await b.close()

    asyncio.run(main())


def test_location_parsing_refuses_what_is_no_url(tmp_path):
    for bad in (
        "http://[::1",
        "http://" + "a" * 2**20,
        f"file://{tmp_path}/x%00y.snapshot",
        "http://:80/x",
        "gopher://x/y",
        f"file://{tmp_path}/../etc/passwd",
    ):  # noqa: E501
        with pytest.raises(InvalidCollectionRequest) as e:
            local_file(bad, tmp_path)
        assert e.value.code == "invalid_value" and e.value.param == "location", bad
    assert local_file("https://example.org/a.snapshot", tmp_path) is None


class _Origin:
    """A raw HTTP origin on 127.0.0.1 answering each request with ``respond(path, headers, writer)``."""

    def __init__(self, respond) -> None:
        self.respond, self.seen, self.ended = respond, [], {}

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in head[1:] if x)}
        path = head[0].split()[1]
        self.seen.append((path, headers))
        try:
            await self.respond(path, headers, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.ended.setdefault(path, asyncio.Event()).set()
            writer.close()


def _limits(**kw) -> FetchLimits:
    return FetchLimits(**{"max_bytes": 2**20, "timeout_s": 5.0, "idle_s": 5.0, "prefixes": (), **kw})


def test_downloads_are_bounded_and_say_nothing_of_the_network(tmp_path):
    bomb = gzip.compress(bytes(64 * 2**20))

    async def respond(path: str, headers: dict, w: asyncio.StreamWriter) -> None:
        if path == "/gzip":
            w.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb) + bomb)
        elif path == "/big":  # chunked, no length: counted as it comes
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(8):
                w.write(b"80000\r\n" + bytes(0x80000) + b"\r\n")
                await w.drain()
            w.write(b"0\r\n\r\n")
        elif path.startswith("/drip"):
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            for _ in range(1000):
                w.write(b"x")
                await w.drain()
                await asyncio.sleep(0.2)
        elif path == "/missing":
            w.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        elif path == "/garbage":
            w.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        elif path.startswith("/redirect"):
            w.write(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % path[9:].encode())
        await w.drain()

    async def main() -> None:
        origin = _Origin(respond)
        url = await origin.start()
        other = _Origin(respond)
        elsewhere = await other.start()
        messages = set()
        for path in ("/gzip", "/big", "/missing", "/garbage"):
            with pytest.raises(InvalidCollectionRequest) as e:
                await fetch(url + path, tmp_path, _limits())
            assert e.value.code == "snapshot_unreachable", path
            messages.add(str(e.value))
        srv = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        srv.close()
        await srv.wait_closed()
        with pytest.raises(InvalidCollectionRequest) as e:  # a closed port
            await fetch(f"http://127.0.0.1:{port}/x", tmp_path, _limits())
        messages.add(str(e.value))
        assert messages == {UNREACHABLE}  # one message whatever answered
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(InvalidCollectionRequest):  # the total time bound
            await fetch(url + "/drip", tmp_path, _limits(timeout_s=1.0))
        assert loop.time() - t0 < 3
        # abandoned: cancelling the caller stops the download and removes its file
        task = asyncio.ensure_future(fetch(url + "/drip-abandoned", tmp_path, _limits(timeout_s=60)))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        ended = origin.ended.setdefault("/drip-abandoned", asyncio.Event())
        await asyncio.wait_for(ended.wait(), 3)  # the origin saw the connection go
        # the api key goes to the location's origin only; the allow-list holds for redirects too
        with pytest.raises(InvalidCollectionRequest):
            await fetch(f"{url}/redirect{elsewhere}/missing", tmp_path, _limits(), api_key="secret")
        assert origin.seen[-1][1].get("api-key") == "secret" and "api-key" not in other.seen[-1][1]
        with pytest.raises(InvalidCollectionRequest) as e:
            await fetch(f"{url}/redirect{elsewhere}/missing", tmp_path, _limits(prefixes=(url + "/",)))
        assert len(other.seen) == 1 and e.value.code == "snapshot_unreachable"
        with pytest.raises(InvalidCollectionRequest) as e:
            await fetch(f"{elsewhere}/missing", tmp_path, _limits(prefixes=(url + "/",)))
        assert e.value.code == "invalid_value" and len(other.seen) == 1
        assert not list((tmp_path / DOWNLOADS).iterdir())  # no file left on any path

    asyncio.run(main())
