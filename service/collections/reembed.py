"""Collections follow the active model: background re-embedding into a shadow, then an atomic swap.

When the active model changes (:meth:`ModelControl.activate` calls :meth:`Reembedder.on_activate`),
every collection embedded by another model is re-embedded from its stored texts:

1. A :class:`Shadow` is attached to the collection: the target model and a
   ``shadow_vectors(iid, vector)`` table in the collection's SQLite file (so progress
   survives a restart: a shadow for the same target model is resumed, any other is reset).
2. The background task reads live points that have no shadow vector yet (by internal id),
   embeds their texts with the target model (through its batcher, beside live traffic) and
   stores the vectors in the shadow table.
3. Meanwhile searches and upserts keep using the collection's current model and index.
   An upsert is embedded with *both* models and written to both (the point table and the
   shadow table, under the collection's write mutex, see ``Collection.upsert``); a deletion
   needs nothing (orphaned shadow rows are dropped at the swap).
4. When every live point has a shadow vector, under the write mutex (writes wait,
   searches go on) the new index is built from the shadow vectors; then under the write
   side of the readers-writer lock, one SQLite transaction moves the shadow vectors into
   the point table and records the new model/dimension, and the in-memory index, spec and
   model are swapped. The old index and its snapshots are released. A change of dimension
   is allowed (the index params are re-normalised for the new dimension).

Progress is reported in ``GET /collections/{name}`` under ``reembedding``:
``{state: running|completed|failed|cancelled, target_model, done, total, rate_per_s,
started_at, finished_at, error}``.

This module uses the collection's lock protocol (``_wmutex``, ``_rw``) directly; it lives in
the collections package for that reason.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from typing import Any

import numpy as np

from .collection import Collection
from .index import IndexSpec, VectorIndex, normalize_params
from .manager import CollectionManager
from .vectors import unit_rows

log = logging.getLogger("service.collections.reembed")

BATCH = 64  # texts per embedder call of the background re-embedding

_SCHEMA = "CREATE TABLE IF NOT EXISTS shadow_vectors (iid INTEGER PRIMARY KEY, vector BLOB NOT NULL)"


def model_id(model: dict[str, Any]) -> str:
    """``name:version`` of a collection's model dict."""
    return f"{model['name']}:{model['version']}"


def same_model(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two model dicts ({name, version, sha256}) denote the same artifact."""
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in ("name", "version", "sha256"))


class Shadow:
    """The re-embedding of one collection towards ``model`` (its vectors: the ``shadow_vectors`` table).

    Args:
        collection: the collection.
        model: target ``{name, version, sha256}``.
        dimension: the target model's embedding width.

    Raises:
        IndexConfigError: the collection's index params do not fit ``dimension`` (e.g. ivf_pq ``m``).
    """

    def __init__(self, collection: Collection, model: dict[str, Any], dimension: int) -> None:
        self.c = collection
        self.model = dict(model)
        spec = collection.spec
        params = normalize_params(spec.kind, _user_params(spec), dimension)
        self.spec = IndexSpec(spec.kind, spec.metric, params, dimension)
        self._conn = sqlite3.connect(
            collection.store.db_path, isolation_level=None, check_same_thread=False, timeout=60.0
        )
        self._conn.execute("PRAGMA busy_timeout=60000")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._lock = threading.Lock()
        self.cancelled = False
        self.status: dict[str, Any] = {
            "state": "running",
            "target_model": dict(model),
            "dimension": dimension,
            "done": 0,
            "total": collection.count,
            "rate_per_s": None,
            "started_at": time.time(),
            "finished_at": None,
            "error": None,
        }

    # --- SQLite (each call blocks; run on the collections pool) ---------------------------------------
    def prepare(self) -> int:
        """Create the shadow table; keep its rows when it was made for this same model (resume), else clear it.

        Returns the number of live points that already have a shadow vector.
        """
        with self._lock:
            c = self._conn
            c.execute(_SCHEMA)
            row = c.execute("SELECT value FROM meta WHERE key='shadow_model'").fetchone()
            import json

            prev = json.loads(row[0]) if row else None
            c.execute("BEGIN IMMEDIATE")
            try:
                if not same_model(prev, self.model):
                    c.execute("DELETE FROM shadow_vectors")
                    c.execute(
                        "INSERT INTO meta(key, value) VALUES ('shadow_model', ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (json.dumps(self.model),),
                    )
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
            return c.execute("SELECT COUNT(*) FROM shadow_vectors s JOIN points p ON p.iid = s.iid").fetchone()[0]

    def pending(self, after_iid: int, limit: int) -> list[tuple[int, str]]:
        """Up to ``limit`` live points with ``iid > after_iid`` and no shadow vector: ``[(iid, text)]`` by iid."""
        with self._lock:
            return self._conn.execute(
                "SELECT p.iid, p.text FROM points p LEFT JOIN shadow_vectors s ON s.iid = p.iid "
                "WHERE s.iid IS NULL AND p.iid > ? ORDER BY p.iid LIMIT ?",
                (after_iid, limit),
            ).fetchall()

    def write(self, iids: np.ndarray, vectors: np.ndarray) -> None:
        """Store shadow vectors (float32 ``(n, dimension)``, normalised here for cosine) for internal ids ``iids``.

        Raises:
            ValueError: wrong vector shape.
        """
        v = np.ascontiguousarray(vectors, dtype=np.float32)
        if v.ndim != 2 or v.shape != (len(iids), self.spec.dimension):
            raise ValueError(f"shadow vectors must have shape ({len(iids)}, {self.spec.dimension}), got {v.shape}")
        if self.spec.metric == "cosine":
            v = unit_rows(v)
        with self._lock:
            c = self._conn
            c.execute("BEGIN IMMEDIATE")
            try:
                c.executemany(
                    "INSERT OR REPLACE INTO shadow_vectors(iid, vector) VALUES (?, ?)",
                    [(int(i), v[j].tobytes()) for j, i in enumerate(iids)],
                )
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise

    def missing(self) -> int:
        """Live points without a shadow vector."""
        with self._lock:
            return self._conn.execute(
                "SELECT COUNT(*) FROM points p LEFT JOIN shadow_vectors s ON s.iid = p.iid WHERE s.iid IS NULL"
            ).fetchone()[0]

    def _iter_shadow(self, chunk: int = 20000):
        last = 0
        while True:
            rows = self._conn.execute(
                "SELECT s.iid, s.vector FROM shadow_vectors s JOIN points p ON p.iid = s.iid WHERE s.iid > ? "
                "ORDER BY s.iid LIMIT ?",
                (last, chunk),
            ).fetchall()
            if not rows:
                return
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            vecs = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), self.spec.dimension)
            yield ids, vecs
            last = int(ids[-1])

    def complete(self) -> bool:
        """Swap the collection to the shadow (see the module docstring, step 4). Blocks; takes the collection's locks.

        Returns:
            True when swapped; False when some live point still lacks a shadow vector (keep re-embedding).
        """
        import json

        c = self.c
        with c._wmutex:
            c._check_open()
            if self.cancelled:
                return False
            with self._lock:
                if self.missing_unlocked():
                    return False
                count = c.count
                sample = None
                if self.spec.kind == "ivf_pq" and count >= self.spec.params["min_train_points"]:
                    rows = self._conn.execute(
                        "SELECT s.vector FROM shadow_vectors s JOIN points p ON p.iid = s.iid ORDER BY random() LIMIT ?",
                        (self.spec.params["train_sample"],),
                    ).fetchall()
                    sample = np.frombuffer(b"".join(r[0] for r in rows), np.float32).reshape(
                        len(rows), self.spec.dimension
                    )
                t0 = time.monotonic()
                index = VectorIndex.build(self.spec, self._iter_shadow(), train_sample=sample)
                built = time.monotonic() - t0
                with c._rw.write():
                    db = self._conn
                    db.execute("BEGIN IMMEDIATE")
                    try:
                        db.execute(
                            "UPDATE points SET vector = (SELECT s.vector FROM shadow_vectors s WHERE s.iid = points.iid)"
                        )
                        cfg = {"index": self.spec.kind, "metric": self.spec.metric, "params": self.spec.params}
                        for k, v in (("model", self.model), ("dimension", self.spec.dimension), ("config", cfg)):
                            db.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps(v), k))
                        db.execute("DELETE FROM meta WHERE key = 'shadow_model'")
                        db.execute("DELETE FROM shadow_vectors")
                        db.execute("DELETE FROM removed")
                        db.execute("COMMIT")
                    except BaseException:
                        db.execute("ROLLBACK")
                        raise
                    old = c.index
                    c.index, c.spec, c.model = index, self.spec, dict(self.model)
                    c.shadow = None
                    for _, p in c._snapshots():  # snapshots of the old vectors: never load them again
                        p.unlink(missing_ok=True)
                    c._snapshot_seq = 0
                    c._snapshot_time = time.monotonic()
                    del old
        log.info(
            "collection %s: swapped to %s (%d points, dimension %d; index built in %.2fs)",
            c.name,
            model_id(self.model),
            count,
            self.spec.dimension,
            built,
        )
        try:
            c.snapshot()
        except Exception:
            log.exception("collection %s: snapshot after the swap failed (SQLite has everything)", c.name)
        return True

    def missing_unlocked(self) -> int:
        return self._conn.execute(
            "SELECT COUNT(*) FROM points p LEFT JOIN shadow_vectors s ON s.iid = p.iid WHERE s.iid IS NULL"
        ).fetchone()[0]

    def drop(self) -> None:
        """Forget this shadow's rows (the target changed, or the collection already uses this model)."""
        with self._lock:
            try:
                self._conn.execute("DELETE FROM shadow_vectors")
                self._conn.execute("DELETE FROM meta WHERE key = 'shadow_model'")
            except sqlite3.Error:
                pass

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass


def _user_params(spec: IndexSpec) -> dict[str, Any]:
    """Params to carry over to a new dimension (derived ivf_pq defaults are recomputed)."""
    p = dict(spec.params)
    if spec.kind == "ivf_pq":
        for k in ("min_train_points", "train_sample"):
            p.pop(k, None)
    return p


class Reembedder:
    """Runs one re-embedding task per collection whose model is not the active one.

    Args:
        app: the FastAPI app (``app.state.embedder``, ``app.state.registry``).
        manager: the :class:`CollectionManager`.
        control: the :class:`~service.model_control.ModelControl`; this registers itself as an
            activation listener and as a user of the models collections are on.
    """

    def __init__(self, app: Any, manager: CollectionManager, control: Any) -> None:
        self.app = app
        self.manager = manager
        self.control = control
        self.tasks: dict[str, asyncio.Task] = {}
        control.listeners.append(self.on_activate)
        control.in_use.append(self.models_in_use)

    def models_in_use(self) -> set[tuple[str, str]]:
        """``{(collection, model_id)}``: every collection needs the model it is embedded with (searches, upserts)."""
        return {(name, model_id(c.model)) for name, c in list(self.manager.collections.items())}

    async def start(self) -> None:
        """Resume: load the models collections are on (best effort) and re-embed those not on the active model."""
        act = self.app.state.registry.active
        for c in list(self.manager.collections.values()):
            try:
                await self.control.load(c.model["name"], c.model["version"])
            except Exception as e:
                log.warning(
                    "collection %s: its model %s cannot be loaded (%s); searches answer 409 until "
                    "re-embedding finishes",
                    c.name,
                    model_id(c.model),
                    e,
                )
            if act is not None:
                self._ensure(c, act.info)

    async def on_activate(self, prev: Any, new: Any) -> None:
        """Activation listener: point every collection at ``new`` (a :class:`ModelInfo`)."""
        for c in list(self.manager.collections.values()):
            self._ensure(c, new)

    def _ensure(self, c: Collection, info: Any) -> None:
        target = {"name": info.name, "version": info.version, "sha256": info.sha256}
        t = self.tasks.get(c.name)
        sh = c.shadow
        if t is not None and not t.done() and sh is not None and same_model(sh.model, target):
            return  # already on its way there
        if t is not None and not t.done():
            t.cancel()
        if same_model(c.model, target):
            if sh is not None:
                c.reembed_status = {
                    **(c.reembed_status or {}),
                    "state": "cancelled",
                    "finished_at": time.time(),
                    "error": f"the active model is {model_id(target)} again, which the collection uses",
                }
                self.tasks[c.name] = asyncio.create_task(self._detach(c, sh, drop=True))
            return
        # visible at once (the activate call answers after this), replaced by the Shadow's own status when it starts
        c.reembed_status = {
            "state": "running",
            "target_model": target,
            "dimension": info.dimension,
            "done": 0,
            "total": c.count,
            "rate_per_s": None,
            "started_at": time.time(),
            "finished_at": None,
            "error": None,
        }
        self.tasks[c.name] = asyncio.create_task(self._run(c, info, target, t), name=f"reembed-{c.name}")

    async def _detach(self, c: Collection, sh: Shadow, drop: bool) -> None:
        def _do() -> None:
            with c._wmutex:
                if c.shadow is sh:
                    c.shadow = None
                sh.cancelled = True
            if drop:
                sh.drop()
            sh.close()

        await self.manager.run(_do)

    async def _run(self, c: Collection, info: Any, target: dict[str, Any], previous: asyncio.Task | None) -> None:
        if previous is not None:
            try:
                await previous
            except (asyncio.CancelledError, Exception):
                pass
        run = self.manager.run
        embedder = self.app.state.embedder
        sh: Shadow | None = None
        try:
            lm = embedder.resolve(info.id)
            sh = Shadow(c, target, info.dimension)
            done = await run(sh.prepare)
            sh.status["done"] = done

            def _attach() -> None:
                with c._wmutex:
                    c._check_open()
                    c.shadow = sh
                    c.reembed_status = sh.status

            await run(_attach)
            log.info("collection %s: re-embedding %d points from %s to %s", c.name, c.count, model_id(c.model), info.id)
            t0, n0 = time.monotonic(), done
            last = 0
            while True:
                rows = await run(sh.pending, last, BATCH)
                if not rows:
                    if await run(sh.complete):
                        break
                    last = 0  # points added meanwhile without a shadow vector: sweep again
                    continue
                iids = np.asarray([r[0] for r in rows], dtype=np.int64)
                res = await embedder.encode([r[1] for r in rows], model=lm, param="points")
                await run(sh.write, iids, res.embeddings)
                last = int(iids[-1])
                st = sh.status
                st["done"] += len(rows)
                st["total"] = max(c.count, st["done"])
                el = time.monotonic() - t0
                rate = float(self.manager.settings.reembed_rate or 0.0)
                if rate > 0 and (slack := (st["done"] - n0) / rate - el) > 0:
                    await asyncio.sleep(slack)  # collections_reembed_rate: leave the CPU to live traffic
                    el = time.monotonic() - t0
                st["rate_per_s"] = round((st["done"] - n0) / el, 2) if el > 0 else None
            el = time.monotonic() - t0
            own = sh.status["done"] - n0  # points this task embedded (live upserts write the shadow themselves)
            sh.status.update(
                state="completed",
                done=c.count,
                total=c.count,
                finished_at=time.time(),
                seconds=round(el, 3),
                rate_per_s=round(own / el, 2) if el > 0 else None,
            )
            sh.close()
        except asyncio.CancelledError:
            if sh is not None:
                sh.status.update(state="cancelled", finished_at=time.time())
                await asyncio.shield(self._detach(c, sh, drop=False))
            raise
        except Exception as e:
            log.exception("collection %s: re-embedding to %s failed", c.name, info.id)
            if sh is not None:
                sh.status.update(state="failed", error=f"{type(e).__name__}: {e}", finished_at=time.time())
                await self._detach(c, sh, drop=False)
            else:
                c.reembed_status = {"state": "failed", "target_model": target, "error": f"{type(e).__name__}: {e}"}

    async def close(self) -> None:
        """Stop every re-embedding (the shadow tables stay, so a restart resumes them)."""
        tasks = [t for t in self.tasks.values() if not t.done()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self.tasks.clear()
