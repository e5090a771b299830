"""Reads of stored points by id for the Qdrant layer's answers (retrieve, hits' vectors, lookups), through the
collections core's :meth:`~service.collections.point_reads.PointReads.retrieve`."""

from __future__ import annotations

from typing import Any

from service.collections.service import CollectionService
from service.collections.vector_backend import ResponseBudget


async def fetch(
    svc: CollectionService,
    name: str,
    ids: list[int | str],
    with_vector: Any,
    where: dict[str, Any] | None = None,
    budget: ResponseBudget | None = None,
    payload: bool = True,
) -> list[dict[str, Any]]:
    """The stored points among ``ids`` (and matching the native filter ``where``, if given), in the order asked
    (missing ones left out, repeats once); without their texts when they are read for a response (a ``budget``: the
    request's, which they spend page by page before their payloads and vectors are read; ``payload``: read them).

    Raises:
        CollectionNotFound; ResponseTooLarge: over ``budget``.
    """
    return await svc.retrieve(
        name, ids, with_payload=payload, with_vectors=with_vector, with_text=budget is None, where=where, budget=budget
    )


async def points_by_id(
    svc: CollectionService,
    name: str,
    ids: list[int | str],
    with_vector: Any = True,
    budget: ResponseBudget | None = None,
) -> dict[tuple[type, Any], Any]:
    """The vectors (``with_vector``: True for all, or their names) of the stored points among ``ids``, as points
    without text nor payload keyed by ``(type(id), id)`` (so ``1`` and ``"1"`` stay apart); ``budget``: the
    request's, when the vectors are read for its response (hits' vectors).

    Raises:
        CollectionNotFound; ResponseTooLarge: over ``budget``.
    """
    points = await fetch(svc, name, ids, with_vector, None, budget, False) if ids else []
    return {(type(p["id"]), p["id"]): p for p in points}
