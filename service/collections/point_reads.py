"""Reads of the collections: lookups, infos, filters, scrolls, counts, and points by id (:meth:`PointReads.retrieve`,
the one place stored points are fetched by id, in ``$ids`` pages).

Everything here raises the domain exceptions of :mod:`.errors`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from service.collections.errors import CollectionNotFound, InvalidCollectionRequest, PointNotFound
from service.collections.filters import Filter, FilterError, parse_filter
from service.collections.schema import VectorsConfig
from service.collections.vector_backend import (
    CollectionHandle,
    CollectionSettings,
    ReadConsistency,
    ResponseBudget,
    VectorBackend,
)


class PointReads:
    """The read side of the collections over ``backend`` (:class:`~.vector_backend.VectorBackend`)."""

    def __init__(self, backend: VectorBackend) -> None:
        self.backend = backend

    @property
    def settings(self) -> CollectionSettings:
        """The backend's :class:`~.vector_backend.CollectionSettings` (the ``collections_*`` settings)."""
        return self.backend.settings

    def parse_filter(self, raw: Any, param: str, vectors: VectorsConfig | None = None) -> Filter | None:
        """The filter tree of a request's ``filter`` field (None: no filter); ``vectors``: the collection's, which
        ``$has_vector`` may name.

        Raises:
            InvalidCollectionRequest: ``invalid_filter``, naming ``param``.
        """
        try:
            kinds = (
                None
                if vectors is None
                else {
                    **{n: "bound" if v.bound else "dense" for n, v in vectors.dense.items()},
                    **dict.fromkeys(vectors.sparse, "sparse"),
                }
            )
            return parse_filter(raw, self.settings.max_filter_values, kinds) if raw is not None else None
        except FilterError as e:
            raise InvalidCollectionRequest(
                str(e).replace("filter", param, 1), param=param, code="invalid_filter"
            ) from e

    def response_budget(self) -> ResponseBudget:
        """A new :class:`~.vector_backend.ResponseBudget` of ``collections_max_response_bytes``: one per request,
        passed to each of its searches and reads."""
        return ResponseBudget(self.settings.max_response_bytes)

    def read_consistency(self, level: str | None = None, after: int | None = None) -> ReadConsistency:
        """A read's consistency: ``level`` (default: ``collections_read_consistency``) and an optional write's
        sequence to read after (see :class:`~.vector_backend.ReadConsistency`)."""
        return ReadConsistency(level or self.settings.read_consistency, after)

    async def collection(self, name: str) -> CollectionHandle:
        """The collection ``name``, looked up on a backend thread (a shared backend may read its registry).

        Raises:
            CollectionNotFound, BackendUnavailable.
        """
        return await self.backend.run(self.backend.get, name)

    async def info(self, name: str, consistency: ReadConsistency | None = None) -> dict[str, Any]:
        """``GET /collections/{name}``'s body (read on a backend thread: on Milvus it counts the points, at
        ``consistency``, default :meth:`read_consistency`)."""
        c = await self.collection(name)
        return await self.backend.run(c.info, consistency or self.read_consistency())

    async def infos(self, consistency: ReadConsistency | None = None) -> list[dict[str, Any]]:
        """Every collection's info, sorted by name, read concurrently on the backend's threads (one deleted
        meanwhile is left out)."""
        rc = consistency or self.read_consistency()
        results = await asyncio.gather(
            *(self.backend.run(c.info, rc) for c in self.backend.list()), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, CollectionNotFound):
                raise r
        return [r for r in results if not isinstance(r, BaseException)]

    async def scroll(
        self,
        name: str,
        start: int | str | None,
        limit: int,
        raw_filter: Any,
        with_vector: bool | list[str] = False,
        budget: ResponseBudget | None = None,
        with_text: bool = True,
        with_payload: bool = True,
    ) -> tuple[list[dict[str, Any]], int | str | None]:
        """A page of points in id order (see :meth:`CollectionHandle.scroll`: ``with_vector`` True or the names of
        the vectors wanted; ``with_text``/``with_payload`` False leave those out): ``(points, next start)``, the next
        start None on the last page. ``limit``: 1 to ``max_top_k``. ``budget``: the request's, which the points spend
        before their texts, payloads and vectors are read (the next page's first point too; None: bounded by ``limit``).

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter or limit), ResponseTooLarge (over ``budget``).
        """
        if not 1 <= limit <= self.settings.max_top_k:
            raise InvalidCollectionRequest(f"limit must be between 1 and {self.settings.max_top_k}", "limit")
        c = await self.collection(name)
        where = self.parse_filter(raw_filter, "filter", c.vectors)
        rows = await self.backend.run(c.scroll, start, limit + 1, where, with_vector, budget, with_text, with_payload)
        return rows[:limit], (rows[limit]["id"] if len(rows) > limit else None)

    async def retrieve(
        self,
        name: str,
        ids: Sequence[int | str],
        *,
        with_payload: bool = True,
        with_vectors: bool | list[str] = False,
        with_text: bool = True,
        where: Any = None,
        budget: ResponseBudget | None = None,
    ) -> list[dict[str, Any]]:
        """The stored points among ``ids`` (and matching the native filter ``where``, if given), in the order asked
        (missing ones left out, a repeated id once), read by :meth:`scroll` in pages of ``$ids`` filters (at most
        ``collections_max_top_k`` ids, and ``collections_max_filter_values`` with ``where``'s value). ``with_vectors``:
        True or the names of the vectors wanted; ``budget``: the request's, which the points spend page by page before
        their texts, payloads and vectors are read. ``1`` and ``"1"`` are different ids.

        Raises:
            CollectionNotFound; InvalidCollectionRequest (a bad ``where``); ResponseTooLarge (over ``budget``).
        """
        ids = list(dict.fromkeys((type(i), i) for i in ids))
        values = self.settings.max_filter_values - (0 if where is None else 1)
        step = max(1, min(self.settings.max_top_k, values))
        found: dict[tuple[type, Any], dict[str, Any]] = {}
        for k in range(0, len(ids), step):
            part = [i for _, i in ids[k : k + step]]
            flt = {"$ids": part} if where is None else {"$and": [{"$ids": part}, where]}
            points, _ = await self.scroll(name, None, len(part), flt, with_vectors, budget, with_text, with_payload)
            found.update({(type(p["id"]), p["id"]): p for p in points})
        return [found[key] for key in ids if key in found]

    async def count(self, name: str, raw_filter: Any) -> int:
        """How many points match the filter (None: all), counted exactly.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter).
        """
        c = await self.collection(name)
        return await self.backend.run(c.count_matching, self.parse_filter(raw_filter, "filter", c.vectors))

    async def get_point(
        self,
        name: str,
        candidates: Sequence[int | str],
        with_vector: bool,
        consistency: ReadConsistency | None = None,
    ) -> dict[str, Any]:
        """The first point found among ``candidates`` (one id read as an integer, then as a string), read at
        ``consistency`` (default :meth:`read_consistency`).

        Raises:
            CollectionNotFound, PointNotFound.
        """
        c = await self.collection(name)
        rc = consistency or self.read_consistency()
        for pid in candidates:
            p = await self.backend.run(c.get, pid, with_vector, rc)
            if p is not None:
                return p
        shown = candidates[-1] if candidates else ""
        raise PointNotFound(f"point {str(shown)!r} not found in collection {name!r}")
