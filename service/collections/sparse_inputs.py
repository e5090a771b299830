"""Sparse vectors a request gives as text (the server-side sparse models of :class:`~.ports.InferencePort`, e.g.
``qdrant/bm25``): made here before the write, on worker threads (tokenising and stemming is CPU work, off the event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np

from service.collections.errors import InvalidCollectionRequest
from service.collections.ports import SparseModel
from service.collections.schema import SparseVec
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
    bound to a model made from the points' texts where not given, as checked :class:`~.schema.SparseVec` (what
    :func:`~.schema.point_vectors` keeps as they are); the models run off the event loop (worker threads, or the
    model's processes)."""
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
        made = unpacked(await asyncio.to_thread(models[m].document_arrays, [t for _, _, t in todo]), len(todo), m)
        for (i, n, _), vec in zip(todo, made):
            rows[i][n] = vec
    return rows


def unpacked(packed: tuple[Any, Any, Any], n: int, model: str) -> list[SparseVec]:
    """The ``n`` :class:`~.schema.SparseVec` of a server-side model's packed batch
    (:meth:`.ports.SparseModel.document_arrays`), checked at once for the whole batch (numpy): the model is this
    service's code, so its vectors are not checked one by one as a client's are (:func:`~.schema.sparse_vec`), and a
    failed check is the service's fault.

    Raises:
        RuntimeError: not ``n`` vectors, or indices not strictly increasing within a vector, or a value not finite.
    """
    idx, vals, off = (np.asarray(a) for a in packed)
    idx, vals = idx.astype(np.uint32, copy=False), vals.astype(np.float32, copy=False)
    ok = len(off) == n + 1 and off[0] == 0 and off[-1] == len(idx) == len(vals) and bool(np.all(np.diff(off) >= 0))
    if ok and len(idx) > 1:
        rising = idx[1:] > idx[:-1]
        rising[off[1:-1][(off[1:-1] > 0) & (off[1:-1] < len(idx))] - 1] = True  # a vector's first index follows any
        ok = bool(rising.all())
    if not ok or not np.isfinite(vals).all():
        raise RuntimeError(f"sparse model {model!r} made malformed vectors")
    return [SparseVec(idx[a:b], vals[a:b]) for a, b in zip(off[:-1].tolist(), off[1:].tolist())]
