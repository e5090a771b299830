"""Collection snapshots of the embedded backend: one uncompressed tar file per snapshot, the unit of backup, download
and recovery (Qdrant's collection snapshots, https://qdrant.tech/documentation/concepts/snapshots/).

An archive holds

* ``manifest.json``: ``{format, collection, sequence, points, created_at, model, dimension, config}``;
* ``points.sqlite3``: the collection's store as of one write (SQLite's online backup API, ``sqlite3_backup``);
* ``index-<seq>.snap``: a FAISS snapshot, written first if writes came since the last one (holding the write mutex
  while the index is serialised, as the background snapshots do), so a recovery loads it and replays the few later
  writes instead of inserting them into the index again (100,000 HNSW points: recovered in 2.6 s instead of 18.6 s,
  docs/performance.md, "Collection snapshots: backup and recovery").

Consistency: the write mutex is held only while a read transaction is opened on the store and the FAISS snapshot
file is opened (no write, FAISS snapshot or pruning can fall in between); the copy itself runs outside it, from that
read transaction (WAL: writers go on). So the archive is the collection exactly as of write ``sequence``.
Vectors do not compress, hence no compression. Creating one needs free space for a copy of the store (staged beside
the archive, then removed).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sqlite3
import tarfile
import time
from pathlib import Path
from typing import Any, BinaryIO

from artifact_contract.fsio import fsync_dir
from service.collections.embedded.archive_checks import (
    check_index_file,
    check_member,
    invalid,
    open_tar,
    read_manifest,
)
from service.collections.embedded.collection import Collection
from service.collections.embedded.snapshots import SNAPSHOT_RE, list_snapshots
from service.collections.embedded.store.files import DB_FILE

FORMAT = 1
MANIFEST = "manifest.json"
SUFFIX = ".snapshot"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}\.snapshot\Z")  # \Z: "a.snapshot\n" is no name
_CHUNK = 1 << 20


def describe(path: Path) -> dict[str, Any]:
    """Qdrant's ``SnapshotDescription`` of the archive at ``path``: ``{name, creation_time (ISO 8601, UTC), size
    (bytes), checksum (SHA-256 hex, from the ``.checksum`` file written beside it)}``."""
    st = path.stat()
    sidecar = path.with_name(path.name + ".checksum")
    checksum = sidecar.read_text().strip() if sidecar.exists() else None
    created = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(st.st_mtime))
    return {"name": path.name, "creation_time": created, "size": st.st_size, "checksum": checksum}


def list_archives(directory: Path) -> list[dict[str, Any]]:
    """The descriptions of the archives in ``directory`` (none when it does not exist), oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if NAME_RE.match(p.name) and p.is_file()]
    return [describe(p) for p in sorted(found, key=lambda p: (p.stat().st_mtime, p.name))]


def sha256_of(path: Path) -> str:
    """SHA-256 hex digest of the file at ``path``, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class _Hashing(io.RawIOBase):
    """A write-only file that hashes what passes through it to ``f``."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.sha = f, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.sha.update(data)
        return self.f.write(data)


def _add(tar: tarfile.TarFile, name: str, f: BinaryIO, size: int, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    tar.addfile(info, f)


def write_archive(c: Collection, directory: Path) -> dict[str, Any]:
    """Write a snapshot of the open collection ``c`` into ``directory`` (created if missing) as
    ``<collection>-<sequence>-<YYYY-MM-DD-HH-MM-SS>.snapshot`` plus its ``.checksum``, durably (a temporary name,
    fsync, rename). Writes to ``c`` go on meanwhile; see the module docstring for what the archive holds.

    Returns:
        its :func:`describe` dict.

    Raises:
        CollectionClosed: ``c`` was deleted.
        OSError: the disk is full or not writable.
    """
    directory.mkdir(parents=True, exist_ok=True)
    work = directory / f".creating-{os.getpid()}-{time.monotonic_ns()}"
    work.mkdir()
    src = sqlite3.connect(c.store.db_path, isolation_level=None, check_same_thread=False)
    index_file: BinaryIO | None = None
    try:
        c.snapshot()  # a FAISS snapshot of every write so far: recovery then replays only what comes next
        src.execute("BEGIN")
        with c.writes_paused():  # nothing is written, snapshotted or pruned between these two reads
            meta = {k: json.loads(v) for k, v in src.execute("SELECT key, value FROM meta")}  # starts the read
            points = src.execute("SELECT count(*) FROM points").fetchone()[0]
            snaps = list_snapshots(c.path)
            if snaps:  # an open file survives its deletion by a later FAISS snapshot
                index_file = open(snaps[-1][1], "rb")
        dst = sqlite3.connect(work / DB_FILE)
        try:
            src.backup(dst)  # one step, within the read transaction above: the store as of meta["seq"]
        finally:
            dst.close()
        src.execute("COMMIT")
        seq, now = int(meta["seq"]), time.time()
        manifest = {"format": FORMAT, "collection": c.name, "sequence": seq, "points": points, "created_at": now}
        manifest |= {k: meta[k] for k in ("model", "dimension", "config") if k in meta}  # none: no model-bound vector
        stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(now))
        name, n = f"{c.name}-{seq}-{stamp}{SUFFIX}", 1
        while (directory / name).exists():  # two snapshots of one write within a second
            name, n = f"{c.name}-{seq}-{stamp}-{n}{SUFFIX}", n + 1
        tmp = work / name
        with open(tmp, "wb") as raw:
            hashing = _Hashing(raw)
            with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                body = json.dumps(manifest, indent=1).encode()
                _add(tar, MANIFEST, io.BytesIO(body), len(body), now)
                with open(work / DB_FILE, "rb") as f:
                    _add(tar, DB_FILE, f, os.fstat(f.fileno()).st_size, now)
                if index_file is not None:
                    _add(tar, Path(index_file.name).name, index_file, os.fstat(index_file.fileno()).st_size, now)
            raw.flush()
            os.fsync(raw.fileno())
        checksum = hashing.sha.hexdigest()
        side = work / f"{name}.checksum"
        side.write_text(checksum + "\n")
        with open(side, "rb") as f:
            os.fsync(f.fileno())
        os.rename(side, directory / side.name)  # the checksum first: an archive is never listed without it
        os.rename(tmp, directory / name)
        fsync_dir(directory)
        return describe(directory / name)
    finally:
        if index_file is not None:
            index_file.close()
        src.close()
        shutil.rmtree(work, ignore_errors=True)


def extract_archive(path: Path, dest: Path, checksum: str | None = None, index: bool = True) -> dict[str, Any]:
    """Check the archive at ``path`` and unpack it into the new directory ``dest`` (a collection directory, files
    fsynced); returns its manifest. Every size it declares is checked first (:mod:`.archive_checks`). With ``index``
    false its FAISS snapshot is left out (the index is then rebuilt from the store when the collection opens): bytes
    from an untrusted client never reach FAISS's reader, whose inner size claims nothing checks.

    Raises:
        InvalidCollectionRequest: ``checksum_mismatch`` (``checksum``, SHA-256 hex, given and different), or
            ``invalid_snapshot``: not a tar archive of this format, a member other than the manifest, the store and
            one FAISS snapshot (paths, links, devices and sparse files are refused), a member declaring more bytes
            than the archive holds, a manifest too large or nested too deep, a FAISS snapshot whose header does not
            add up to its size, a store that fails SQLite's ``quick_check`` or whose last write differs from the
            manifest's.
    """
    if checksum is not None and sha256_of(path) != checksum.strip().lower():
        raise invalid(f"the snapshot's SHA-256 is not {checksum}", code="checksum_mismatch")
    dest.mkdir(parents=True)
    size = path.stat().st_size
    with open_tar(path) as tar:
        seen: set[str] = set()
        try:
            for m in tar:
                ok = m.name in (MANIFEST, DB_FILE) or SNAPSHOT_RE.match(m.name)
                if not ok or not m.isreg() or m.name in seen or (m.name.startswith("index-") and "index" in seen):
                    raise invalid(f"unexpected member {m.name!r} in the snapshot")
                check_member(m, size)
                seen.add(m.name)
                seen.add("index" if m.name.startswith("index-") else m.name)
                if m.name.startswith("index-") and not index:
                    continue
                with tar.extractfile(m) as f, open(dest / m.name, "wb") as out:
                    shutil.copyfileobj(f, out, _CHUNK)
                    out.flush()
                    os.fsync(out.fileno())
        except (tarfile.TarError, EOFError, OSError) as e:
            raise invalid(f"the snapshot archive is damaged or truncated: {e}") from None
    if MANIFEST not in seen or DB_FILE not in seen:
        raise invalid(f"the snapshot lacks {MANIFEST} or {DB_FILE}")
    manifest = read_manifest(dest / MANIFEST)
    if manifest.get("format") != FORMAT:
        raise invalid(f"snapshot format {str(manifest.get('format'))[:20]!r}; this service reads format {FORMAT}")
    for snap in dest.glob("index-*.snap"):
        check_index_file(snap)
    try:
        conn = sqlite3.connect(dest / DB_FILE)
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            seq = json.loads(conn.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()[0])
        finally:
            conn.close()
    except (ValueError, KeyError, TypeError, RecursionError, sqlite3.Error) as e:
        raise invalid(f"the snapshot's store is unreadable: {e}") from None
    if check != "ok" or seq != manifest.get("sequence"):
        raise invalid(f"the snapshot's store is damaged (quick_check: {check}; sequence {str(seq)[:30]})")
    (dest / MANIFEST).unlink()
    fsync_dir(dest)
    return manifest
