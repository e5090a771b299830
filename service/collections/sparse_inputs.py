"""Sparse vectors a request gives as text (the server-side sparse models of :class:`~.ports.InferencePort`, e.g.
``qdrant/bm25``): made here before the write, on worker threads (tokenising and stemming is CPU work, off the event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from service.collections.errors import InvalidCollectionRequest
from service.collections.ports import SparseModel
from service.collections.vector_backend import CollectionHandle


def sparse_model(models: Mapping[str, SparseModel], name: str, param: str) -> SparseModel:
    """The server-side sparse model ``name``.

    Raises:
        InvalidCollectionRequest: no such model (``model_mismatch``).
    """
    if name not in models:
        raise InvalidCollectionRequest(
            f"{param}: {name!r} is not a sparse model of this service ({sorted(models)})",
            param,
            "model_mismatch",
        )
    return models[name]


async def sparse_from_texts(
    models: Mapping[str, SparseModel], c: CollectionHandle, texts: list[str], named: Any, fill: bool
) -> list[dict[str, Any]] | None:
    """``named`` with every ``{text, model}`` sparse vector made by its model, and (``fill``) the sparse vectors
    bound to a model made from the points' texts where not given; the models run on worker threads."""
    bound = {n: v.model for n, v in c.vectors.sparse.items() if v.model} if fill else {}
    if not bound and not any(isinstance(v, dict) and "text" in v for p in named or [] for v in (p or {}).values()):
        return list(named) if named else None
    rows = [dict(p or {}) for p in (named or [{}] * len(texts))]
    jobs: dict[str, list[tuple[int, str, str]]] = {}  # model -> [(point, vector name, text)]
    for i, row in enumerate(rows):
        for n, v in row.items():
            if isinstance(v, dict) and set(v) == {"text", "model"}:
                sparse_model(models, v["model"], f"points[{i}].vectors.{n}.model")
                jobs.setdefault(v["model"], []).append((i, n, v["text"]))
        for n, m in bound.items():
            if n not in row and texts[i]:
                jobs.setdefault(m, []).append((i, n, texts[i]))
    for m, todo in jobs.items():
        made = await asyncio.to_thread(models[m].documents, [t for _, _, t in todo])
        for (i, n, _), vec in zip(todo, made):
            rows[i][n] = vec
    return rows
