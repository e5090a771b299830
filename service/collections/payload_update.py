"""Payload updates of stored points (Qdrant API reference: ``POST``/``PUT /collections/{collection_name}/points/
payload``, set and overwrite; ``POST .../points/payload/delete``, delete keys): the points are read and written back,
a page at a time, with their stored texts and vectors and the new payloads.

* Every payload the request would write is checked against ``collections_max_payload_bytes`` before the first write
  (a merge reads the matching points once more for that), so a refused request changes nothing.
* A page's vectors are written back under the model that made them: a re-embedding switch that completes between
  the read and the write makes the page be read again (:class:`~.errors.ModelChanged`).
* A list of ids is read as ``$ids`` filters of at most ``collections_max_filter_values`` ids each.
* Not atomic with concurrent writes to the same points.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from service.collections.conditions import parse_path, payload_names
from service.collections.errors import RETRIES, InvalidCollectionRequest, ModelChanged
from service.collections.payload_checks import check_payload_sizes
from service.collections.point_reads import PointReads
from service.collections.vector_backend import CollectionSettings
from service.collections.writes import PointWrites


def set_at(payload: dict[str, Any] | None, key: str, value: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``payload`` with ``value`` merged into the object at the path ``key`` (Qdrant's ``set_payload`` with
    ``key``, API reference "Set payload": ``a.b`` nests, ``a[]`` every element of an array, ``a[2]`` one, ``a."b.c"``
    the key ``b.c``; :func:`.conditions.parse_path`): missing
    objects on the path are created, a non-object where an object is needed is replaced by one, a non-array where an
    array is needed becomes ``[]`` (and nothing is written below it), an index past an array's end writes nothing; a
    ``null`` in ``value`` removes that key, as Qdrant's merge does."""
    items = parse_path(key) or ()

    def merged(into: Any) -> dict[str, Any]:
        out = dict(into) if isinstance(into, dict) else {}
        for k, v in copy.deepcopy(value).items():
            out.pop(k, None) if v is None else out.__setitem__(k, v)
        return out

    def put(x: Any, i: int) -> Any:  # x with value written at items[i:]
        if i == len(items):
            return merged(x)
        head = items[i]
        if isinstance(head, str):
            x = dict(x) if isinstance(x, dict) else {}
            x[head] = put(x.get(head), i + 1)
            return x
        if not isinstance(x, list):
            return []
        x = list(x)
        for j in range(len(x)) if head is None else [head] if head < len(x) else []:
            x[j] = put(x[j], i + 1)
        return x

    return put(copy.deepcopy(payload or {}), 0)


def without_keys(payload: dict[str, Any] | None, keys: list[str]) -> dict[str, Any]:
    """A copy of ``payload`` without ``keys``; a dotted key (``"meta.lang"``) removes a key of a nested object, as in
    Qdrant's payload key paths (and this service's filter keys; a quoted part is one name: ``'a."b.c"'``;
    :func:`.conditions.payload_names`). A key absent from the payload, or a path into arrays, changes nothing."""
    out = copy.deepcopy(payload or {})
    for key in keys:
        names = payload_names(key)
        if names is None:
            continue
        *path, last = names
        cur: Any = out
        for part in path:
            cur = cur.get(part) if isinstance(cur, dict) else None
        if isinstance(cur, dict):
            cur.pop(last, None)
    return out


class PayloadUpdates:
    """Payload and vector updates of stored points (module docstring): pages read through ``reads``, written back
    through ``writes``."""

    def __init__(self, reads: PointReads, writes: PointWrites) -> None:
        self.reads = reads
        self.writes = writes

    @property
    def settings(self) -> CollectionSettings:
        """The ``collections_*`` settings."""
        return self.reads.settings

    async def set_payload(
        self,
        name: str,
        ids: list[int | str] | None,
        raw_filter: Any,
        payload: dict[str, Any],
        merge: bool,
        key: str | None = None,
    ) -> int:
        """Merge ``payload`` into (``merge``) or put it in place of the payload of the points among ``ids`` or matching
        ``raw_filter`` (module docstring) of the collection ``name``; returns the last write's sequence (0
        when no point matched).

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter, a resulting payload too large: nothing written),
            ReembeddingInProgress, ModelChanged (the collection switched models :data:`~.errors.RETRIES` times meanwhile).
        """
        wheres, cap, page = self._wheres(ids, raw_filter), self.settings.max_payload_bytes, self._page()

        if key is not None and (not merge or parse_path(key) is None):
            raise InvalidCollectionRequest(
                f"key {key!r}: a payload path (dotted, [] or [N] after a name, a part in double "
                'quotes as written: a."b.c") to merge into',
                "key",
            )

        def updated(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if key is not None:
                return [set_at(p["payload"], key, payload) for p in points]
            return [{**(p["payload"] or {}), **payload} if merge else dict(payload) for p in points]

        check_payload_sizes([payload], cap, ["payload"])
        for where in wheres if merge else ():  # the merged payloads, all checked before the first write
            start = None
            while True:
                points, start = await self.reads.scroll(name, start, page, where)
                check_payload_sizes(
                    updated(points), cap, [f"the payload merged into point {p['id']!r}" for p in points]
                )
                if start is None:
                    break
        return await self._rewrite(name, wheres, updated)

    async def delete_payload_keys(
        self, name: str, ids: list[int | str] | None, raw_filter: Any, keys: list[str]
    ) -> int:
        """Remove ``keys`` (:func:`without_keys`) from the payload of the points among ``ids`` or matching
        ``raw_filter`` of the collection ``name``; returns the last write's sequence (0 when no point matched).

        Raises:
            as :func:`set_payload` (a payload only shrinks: no size check).
        """
        return await self._rewrite(
            name, self._wheres(ids, raw_filter), lambda points: [without_keys(p["payload"], keys) for p in points]
        )

    def _wheres(self, ids: list[int | str] | None, raw_filter: Any) -> list[Any]:
        """The filters to page through: ``raw_filter``, or ``$ids`` filters of at most ``max_filter_values`` ids each."""
        if ids is None:
            return [raw_filter]
        ids, step = list(dict.fromkeys(ids)), self.settings.max_filter_values
        return [{"$ids": ids[i : i + step]} for i in range(0, len(ids), step)]

    def _page(self) -> int:
        return min(self.settings.max_points_per_request, self.settings.max_top_k)

    async def _rewrite(
        self, name: str, wheres: list[Any], updated: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    ) -> int:
        """Write back every point matching one of ``wheres`` with the payloads ``updated`` makes of a page of points."""

        def edit(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{**p, "payload": q} for p, q in zip(points, updated(points))]

        return await self.rewrite_points(name, wheres, edit)

    async def rewrite_points(
        self, name: str, wheres: list[Any], edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    ) -> int:
        """Write back every point matching one of ``wheres`` (pages of stored points ``{id, text, payload, vector,
        vectors}``) as ``edit`` changes them; returns the last write's sequence (0 when no point matched). The points are
        read with every vector and written back whole (not atomic with concurrent writes to the same points); a model
        switch between the read and the write makes the page be read again.

        Raises:
            ModelChanged: the collection switched models :data:`~.errors.RETRIES` times meanwhile; and what
                :meth:`~.service.CollectionService.upsert` raises.
        """
        page, seq, stale = self._page(), 0, 0
        for where in wheres:
            start = None
            while True:
                model = (await self.reads.collection(name)).model  # the stored vectors read below are this model's
                points, after = await self.reads.scroll(name, start, page, where, with_vector=True)
                if points:
                    points = edit(points)
                    ids_, texts = [p["id"] for p in points], [p["text"] for p in points]
                    vecs, named = [p.get("vector") for p in points], [p.get("vectors") for p in points]
                    try:  # every vector written back as stored: the model-bound one and the named others
                        _, seq = await self.writes.upsert(
                            name,
                            ids_,
                            texts,
                            [p["payload"] for p in points],
                            vecs if model else None,
                            vectors_model=model and dict(model),
                            named=named,
                        )
                    except ModelChanged:  # a switch completed meanwhile: read the page again, with the new vectors
                        stale += 1
                        if stale == RETRIES:
                            raise
                        continue
                if (start := after) is None:
                    break
        return seq

    async def delete_vectors(self, name: str, ids: list[int | str] | None, raw_filter: Any, names: list[str]) -> int:
        """Remove the named vectors ``names`` from the points among ``ids`` or matching ``raw_filter`` (Qdrant's
        ``delete_vectors``); returns the last write's sequence (0 when no point matched).

        Raises:
            InvalidCollectionRequest: a name the collection lacks, or its model-bound vector (every point holds it: it
                is made from the text).
        """
        cfg = (await self.reads.collection(name)).vectors
        for n in names:
            cfg.kind_of(n, "vector")
            if cfg.bound is not None and n == cfg.bound.name:
                raise InvalidCollectionRequest(f"{n!r} is the model-bound vector, which every point holds", "vector")

        def edit(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [
                {**p, "vectors": {k: v for k, v in (p.get("vectors") or {}).items() if k not in names}} for p in points
            ]

        return await self.rewrite_points(name, self._wheres(ids, raw_filter), edit)

    async def update_vectors(self, name: str, updates: dict[Any, tuple[str | None, Any, dict[str, Any]]]) -> int:
        """Set some vectors of existing points, keeping the others (Qdrant's ``update_vectors``): ``updates`` maps a
        point id to ``(new text or None, new model-bound vector or None, {name: new named vector})``; points not stored
        are left out (as Qdrant answers 404 for them, the caller checks first). Returns the last write's sequence.
        """

        def edit(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
            out = []
            for p in points:
                text, vec, named = updates[p["id"]]
                q = {**p, "vectors": {**(p.get("vectors") or {}), **named}}
                if text is not None:  # a new text: the model-bound vector is embedded from it
                    q.update(text=text, vector=None)
                elif vec is not None:
                    q["vector"] = vec
                out.append(q)
            return out

        return await self.rewrite_points(name, self._wheres(list(updates), None), edit)
