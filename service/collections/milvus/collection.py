"""One collection on the milvus backend (:class:`~..backend.CollectionHandle`).

The collection's record (:mod:`.catalog`) says which physical Milvus collection holds its points and which model
made their vectors; every replica keeps a view of it, refreshed every ``collections_milvus_refresh_s``. Reads use
the view; a write first makes sure its view is at most ``refresh_s`` old, so once a re-embedding is announced, every
write that starts ``refresh_s`` later goes to both physical collections (see :mod:`.target`).

Semantics follow the embedded backend: a repeated id keeps its last occurrence; cosine vectors are stored
unit-normalised; l2 scores are Euclidean distances; a delete counts the points that existed. Differences: a point's
text is limited to 65,535 UTF-8 bytes (Milvus VARCHAR; longer texts are refused with 422); IVF-PQ results are
Milvus's own (no exact re-ranking); the HNSW/IVF-PQ maintenance params (``rebuild_fraction``,
``min_train_points``, ``train_sample``, ``rerank``) are recorded but Milvus manages its indexes itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from pymilvus import MilvusException

from service.collections.errors import CollectionClosed, InvalidCollectionRequest, ModelChanged
from service.collections.filters import Filter
from service.collections.ids import decode_id, encode_id
from service.collections.index import IndexSpec
from service.collections.metric import higher_is_better, normalised
from service.collections.milvus.catalog import older_status, revision
from service.collections.milvus.client import BoundedClient, long_call
from service.collections.milvus.expr import keys_expr, to_expr
from service.collections.milvus.schema import MAX_KEY_BYTES, MAX_TEXT_BYTES, api_score, search_params, to_rows
from service.collections.milvus.target import MilvusTarget, Reembeddings
from service.collections.payload_indexes import PayloadIndex
from service.collections.reads import STRONG, Hit, ReadConsistency
from service.collections.schema import VectorsConfig
from service.collections.scorers import Scorer
from service.collections.vector_backend import same_model

_PAGE = 16384  # Milvus's query window
_FIELDS = ["text", "payload"]
_LEVELS = {"strong": "Strong", "bounded": "Bounded", "eventual": "Eventually"}


def wants_vector(with_vector: bool | list[str], name: str) -> bool:
    """Whether a read's ``with_vector`` (True, or vector names) asks for the collection's one vector (``name``)."""
    return with_vector is True or (isinstance(with_vector, list) and name in with_vector)


def read_kw(consistency: ReadConsistency) -> dict[str, Any]:
    """pymilvus keyword arguments of a search or query at ``consistency`` (Milvus docs, "Consistency Level"):
    ``Strong``/``Bounded``/``Eventually``; with a token (``after``) and a level weaker than strong, Milvus's
    ``Customized`` level with the token as the guarantee timestamp: the read waits until the query nodes have
    consumed the data stream up to that write, and no further."""
    if consistency.after is not None and consistency.level != "strong":
        return {"consistency_level": "Customized", "guarantee_timestamp": max(1, int(consistency.after))}
    return {"consistency_level": _LEVELS[consistency.level]}


class MilvusCollection:
    """A collection whose points live in Milvus.

    Args:
        client: the backend's bounded Milvus client.
        reread: re-reads the record of a collection by name and updates or closes its view (the backend's
            :meth:`~.backend.MilvusBackend.refresh_one`).
        refresh_s: the longest a write trusts its record view (``collections_milvus_refresh_s``).
        reembeddings: starts this collection's re-embeddings (:mod:`.target`).
        record: the collection's registry record.
        status: its shared re-embedding status, or None.
    """

    def __init__(
        self,
        client: BoundedClient,
        reread: Callable[[str], None],
        refresh_s: float,
        reembeddings: Reembeddings,
        record: dict[str, Any],
        status: dict[str, Any] | None = None,
    ) -> None:
        self._client, self._reread, self._refresh_s, self._reembeddings = client, reread, refresh_s, reembeddings
        self.name: str = record["name"]
        self.closed = False
        self._local_status: dict[str, Any] | None = None
        self.record: dict[str, Any] = {}
        self.shared_status: dict[str, Any] | None = None
        self.update(record, status)

    # --- the record view --------------------------------------------------------------------------------------
    def update(self, record: dict[str, Any], status: dict[str, Any] | None) -> None:
        """Replace the view with a record (and status) read from the registry, unless the view already holds a newer
        one: reads run on several threads, so a read that started before a switch can finish after it."""
        if revision(record) < revision(self.record):
            return
        if status is not None and older_status(status, self.shared_status):
            status = self.shared_status
        self.record, self.shared_status, self.seen = record, status, time.monotonic()

    def fresh(self) -> dict[str, Any]:
        """The record, re-read when the view is older than ``refresh_s``.

        Raises:
            CollectionClosed: the collection was deleted.
        """
        if time.monotonic() - self.seen > self._refresh_s:
            self._reread(self.name)
        if self.closed:
            raise CollectionClosed(f"collection {self.name!r} not found (deleted)")
        return self.record

    @staticmethod
    def spec_of(record: dict[str, Any]) -> IndexSpec:
        """The index spec a record describes."""
        return IndexSpec(record["kind"], record["metric"], record["params"], int(record["dimension"]))

    @property
    def spec(self) -> IndexSpec:
        """The index spec of the current record view."""
        return self.spec_of(self.record)

    @property
    def model(self) -> dict[str, Any]:
        """A copy of the record view's model record ``{name, version, sha256}``."""
        return dict(self.record["model"])

    @property
    def vectors(self) -> VectorsConfig:
        """One model-bound vector: what Milvus 2.3 holds (one vector field per collection)."""
        return VectorsConfig.single(self.spec, self.model, self.record.get("vector_name", ""))

    @property
    def reembed_model(self) -> dict[str, Any] | None:
        """The target model of the re-embedding announced in the record view, else None."""
        rb = self.record.get("reembed")
        return dict(rb["model"]) if rb else None

    @property
    def reembed_status(self) -> dict[str, Any] | None:
        """The shared progress of the last re-embedding, or this replica's newer placeholder."""
        shared, local = self.shared_status, self._local_status
        if local is not None and (shared is None or local.get("started_at", 0) > shared.get("started_at", 0)):
            return local
        return shared

    @reembed_status.setter
    def reembed_status(self, value: dict[str, Any] | None) -> None:
        self._local_status = value

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """A Milvus call; a physical collection that vanished (a switch and retirement, or a delete by another
        replica) re-reads the record and raises :class:`ModelChanged` or :class:`CollectionClosed`."""
        try:
            return fn(*args, **kw)  # the backend's client bounds every call (see .client)
        except MilvusException as e:
            if "not found" not in str(e) and "not exist" not in str(e):
                raise
            self._reread(self.name)
            if self.closed:
                raise CollectionClosed(f"collection {self.name!r} not found (deleted)") from e
            raise ModelChanged(f"collection {self.name} moved to {self.record['physical']}") from e

    def physical_collections(self) -> list[str]:
        """The Milvus collections this view's record uses: its points, and a re-embedding's target."""
        rb = self.record.get("reembed")
        return [self.record["physical"]] + ([rb["physical"]] if rb else [])

    @property
    def count(self) -> int:
        """Live points (a strongly consistent count)."""
        return self._count(self.fresh())

    def _count(self, rec: dict[str, Any], consistency: ReadConsistency = STRONG) -> int:
        rows = self._call(
            self._client.query, rec["physical"], filter="", output_fields=["count(*)"], **read_kw(consistency)
        )
        return int(rows[0]["count(*)"])

    # --- writes -----------------------------------------------------------------------------------------------
    def upsert(
        self, ids, texts, payloads, vectors, *, model=None, shadow_model=None, shadow_vectors=None, named=None
    ) -> int:
        """Insert or replace points (see :meth:`~..backend.CollectionHandle.upsert`); returns the write's sequence,
        once Milvus has acknowledged it: a Milvus timestamp allocated after the acknowledgement, a read-your-writes
        token for any replica (:func:`read_kw`).

        Raises:
            CollectionClosed, ModelChanged; InvalidCollectionRequest: a text or id longer than Milvus stores.
        """
        last = {encode_id(pid): i for i, pid in enumerate(ids)}
        order, keys = list(last.values()), list(last.keys())
        for i in order:
            if len(texts[i].encode()) > MAX_TEXT_BYTES:
                raise InvalidCollectionRequest(
                    f"text of {len(texts[i].encode())} bytes; the milvus backend stores at most {MAX_TEXT_BYTES}",
                    param=f"points[{i}].text",
                )
        if any(len(k.encode()) > MAX_KEY_BYTES for k in keys):
            raise InvalidCollectionRequest(f"a point id is longer than {MAX_KEY_BYTES} bytes", param="points")
        rec = self.fresh()
        rb = rec.get("reembed")
        if model is not None and not same_model(model, rec["model"]):
            if not same_model(shadow_model, rec["model"]):
                raise ModelChanged(f"collection {self.name} is now embedded by {rec['model']}")
            vectors, shadow_model, shadow_vectors = shadow_vectors, None, None  # a switch happened meanwhile
        if rb and (shadow_vectors is None or not same_model(shadow_model, rb["model"])):
            raise ModelChanged(f"collection {self.name} is being re-embedded with {rb['model']}")
        texts_ = [texts[i] for i in order]
        payloads_ = [payloads[i] for i in order]
        updated = time.time_ns()
        rows = to_rows(keys, texts_, payloads_, np.asarray(vectors)[order], updated, rec["metric"], rec["dimension"])
        self._call(self._client.upsert, rec["physical"], rows)
        if rb:
            srows = to_rows(
                keys, texts_, payloads_, np.asarray(shadow_vectors)[order], updated, rec["metric"], rb["dimension"]
            )
            self._call(self._client.upsert, rb["physical"], srows)
        return self._client.timestamp()  # after the acknowledgement: a token for reading this write

    def delete(self, ids: list[int | str] | None = None, where: Filter | None = None) -> tuple[int, int]:
        """Delete by ids and/or filter (from both physical collections while re-embedding); ``(deleted, sequence)``,
        the sequence a read-your-writes token (:meth:`~.client.BoundedClient.timestamp`)."""
        rec = self.fresh()
        parts = ([keys_expr([encode_id(i) for i in ids])] if ids else []) + (
            [to_expr(where)] if where is not None else []
        )
        deleted = 0
        while parts:
            expr = " or ".join(f"({p})" for p in parts)
            found = [r["key"] for r in self._call(self._client.query, rec["physical"], filter=expr, limit=_PAGE)]
            for physical in [rec["physical"]] + ([rec["reembed"]["physical"]] if rec.get("reembed") else []):
                if found:
                    self._call(self._client.delete, physical, filter=keys_expr(found))
            deleted += len(found)
            if len(found) < _PAGE:
                break
        return deleted, self._client.timestamp()

    # --- reads ------------------------------------------------------------------------------------------------
    def get(
        self, point_id: int | str, with_vector: bool = False, consistency: ReadConsistency = STRONG
    ) -> dict[str, Any] | None:
        """The stored point ``{id, text, payload[, vector]}`` or None, read at ``consistency``."""
        rec = self.fresh()
        with_vector = wants_vector(with_vector, rec.get("vector_name", ""))
        fields = _FIELDS + (["vector"] if with_vector else [])
        rows = self._call(
            self._client.query,
            rec["physical"],
            filter=keys_expr([encode_id(point_id)]),
            output_fields=fields,
            **read_kw(consistency),
        )
        if not rows:
            return None
        out = {"id": point_id, "text": rows[0]["text"], "payload": rows[0]["payload"]}
        if with_vector:
            out["vector"] = [float(x) for x in rows[0]["vector"]]
        return out

    def scroll(self, start, limit, where=None, with_vector=False, budget=None, with_text=True, with_payload=True):
        """Points in stored-key order from ``start`` (see :meth:`~..backend.CollectionHandle.scroll`): Milvus answers
        a limited query with the smallest primary keys, sorted here (Python's order of ``str`` is UTF-8 byte order,
        as Milvus compares VARCHAR keys); ``budget`` spent as the rows arrive (one query of ``limit`` rows at most:
        ResponseTooLarge past it)."""
        rec = self.fresh()
        with_vector = wants_vector(with_vector, rec.get("vector_name", ""))
        parts = ([f"key >= {json.dumps(encode_id(start), ensure_ascii=False)}"] if start is not None else []) + (
            [to_expr(where)] if where is not None else []
        )
        expr = " and ".join(f"({p})" for p in parts) or 'key != ""'
        fields = ["key"] + [f for f, w in zip([*_FIELDS, "vector"], (with_text, with_payload, with_vector)) if w]
        rows = self._call(self._client.query, rec["physical"], filter=expr, output_fields=fields, limit=limit)
        rows.sort(key=lambda r: r["key"])
        out = []
        for r in rows[:limit]:
            p = {"id": decode_id(r["key"]), "text": r.get("text"), "payload": r.get("payload")}
            if budget is not None:
                budget.spend_point(r["key"], p["text"], p["payload"], len(r["vector"]) if with_vector else 0)
            if with_vector:
                p["vector"] = [float(x) for x in r["vector"]]
            out.append(p)
        return out

    def count_matching(self, where: Filter | None = None) -> int:
        """Live points matching ``where`` (a strongly consistent count)."""
        rec = self.fresh()
        rows = self._call(self._client.query, rec["physical"], filter=to_expr(where), output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def search(
        self,
        queries,
        top_k,
        where=None,
        score_threshold=None,
        with_payload=True,
        with_text=True,
        model=None,
        budget=None,
        consistency=STRONG,
        using=None,
        exact=False,
        quantization=None,
        hnsw_ef=None,
    ):
        """Nearest points of each query (see :meth:`~..backend.CollectionHandle.search`), read at ``consistency``
        (``quantization`` has no effect: no index here is quantized; ``hnsw_ef``: an HNSW index's ``ef``).

        Raises:
            CollectionClosed, ModelChanged; InvalidCollectionRequest: a multi-example query (not on Milvus).
        """
        if isinstance(queries, Scorer):
            raise InvalidCollectionRequest(
                f"a {queries.kind} query is not supported by the milvus backend", "query", "unsupported"
            )
        rec = self.fresh()
        if model is not None and not same_model(model, rec["model"]):
            raise ModelChanged(f"collection {self.name} is now embedded by {rec['model']}")
        spec = self.spec_of(rec)  # one record for the whole call: a switch meanwhile cannot tear it
        q = np.asarray(queries, dtype=np.float32)
        q = normalised(q, spec.metric)
        fields = (["text"] if with_text else []) + (["payload"] if with_payload else [])
        res = self._call(
            self._client.search,
            rec["physical"],
            data=[row.tolist() for row in q],
            limit=top_k,
            filter=to_expr(where),
            output_fields=fields,
            search_params=search_params(spec, top_k, hnsw_ef),
            **read_kw(consistency),
        )
        hib = higher_is_better(spec.metric)
        out: list[list[Hit]] = []
        for hits in res:
            row: list[Hit] = []
            for h in hits:
                s = api_score(spec.metric, h["distance"])
                if score_threshold is not None and (s < score_threshold if hib else s > score_threshold):
                    continue
                e = h["entity"]
                text, payload = e.get("text"), e.get("payload")
                if budget is not None:  # Milvus has sent them already: at most 64 KB of text and of payload each
                    budget.spend_point(h["id"], text, payload)
                row.append(Hit(decode_id(h["id"]), s, text, payload))
            out.append(row)
        return out

    def create_payload_index(self, index: PayloadIndex) -> None:
        """Accepted with no effect (:mod:`...payload_indexes`): Milvus 2.3 indexes no key of a JSON field; its
        filters read the payloads. Not reported in ``info()``."""

    def delete_payload_index(self, key: str) -> bool:
        """Nothing to drop (:meth:`create_payload_index`): False."""
        return False

    def info(self, consistency: ReadConsistency = STRONG) -> dict[str, Any]:
        """Description for ``GET /collections/{name}`` (the same fields as the embedded backend's; the count read
        at ``consistency``)."""
        rec = self.fresh()  # one record for the whole answer: a switch meanwhile cannot tear it
        spec, count = self.spec_of(rec), self._count(rec, consistency)
        return {
            "name": self.name,
            "status": "ok",
            "count": count,
            "dimension": spec.dimension,
            "metric": spec.metric,
            "index": {
                "type": spec.kind,
                "params": spec.params,
                "trained": True,
                "in_use": spec.kind,
                "vectors": count,
                "tombstones": 0,
            },
            "trained": True,
            "model": dict(rec["model"]),
            "vectors": {
                "dense": {"": {**VectorsConfig.single(spec, rec["model"]).to_json()["dense"][""], "points": count}},
                "sparse": {},
            },
            "reembedding": self.reembed_status,
            "sequence": None,
            "snapshot_sequence": None,
            "created_at": rec.get("created_at", 0.0),
            "backend": {"type": "milvus", "physical": rec["physical"]},
        }

    # --- re-embedding -----------------------------------------------------------------------------------------
    @long_call
    def begin_reembed(self, model: dict[str, Any], dimension: int, owner: str) -> MilvusTarget | None:
        """Claim and attach the re-embedding towards ``model`` (see :mod:`.target`); None when another replica
        holds the claim."""
        return self._reembeddings.begin(self, model, dimension, owner)

    def record_json(self) -> str:
        """The record as JSON text (logs)."""
        return json.dumps(self.record, sort_keys=True)
