"""A dense vector's index changed on an existing collection (Qdrant API reference: "Update collection parameters",
``PATCH /collections/{collection_name}`` with another ``quantization_config``, a vector's or the collection's; Qdrant
rebuilds the vector's index in the background). The new vectors config is computed here (:func:`with_indexes`) and
applied by the backend (:meth:`~.vector_backend.VectorBackend.update_vectors`) under the collection's write lock,
atomically and durably; the embedded backend then rebuilds the index from the stored vectors in its upkeep, searches
answering from the old index meanwhile (``info()['rebuilding']`` names the vectors not rebuilt yet).

Only the index changes: the vector's metric and dimension stay, and so do the stored values.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from service.collections.errors import InvalidCollectionRequest
from service.collections.index import IndexConfigError, IndexSpec, normalize_params
from service.collections.schema import VectorsConfig


def with_indexes(cfg: VectorsConfig, indexes: dict[str, tuple[str, dict[str, Any]]]) -> VectorsConfig | None:
    """``cfg`` with each dense vector named in ``indexes`` given the index ``(kind, params)`` (params completed and
    checked for its dimension: :func:`~.index.normalize_params`); None when nothing differs.

    Raises:
        InvalidCollectionRequest: a name that is no dense vector (``vector_not_found``), a multivector (searched
            exactly, without an index), a bad kind or params (``param`` ``vectors.<name>``).
    """
    dense = dict(cfg.dense)
    for name, (kind, params) in indexes.items():
        v, at = dense.get(name), f"vectors.{name}" if name else "vectors"
        if v is None:
            raise InvalidCollectionRequest(f"the collection has no dense vector {name!r}", at, "vector_not_found")
        if v.multivector:
            raise InvalidCollectionRequest(f"{at}: a multivector has no index (searched exactly)", at)
        try:
            spec = IndexSpec(kind, v.spec.metric, normalize_params(kind, params, v.spec.dimension), v.spec.dimension)
        except IndexConfigError as e:
            raise InvalidCollectionRequest(f"{at}: {e}", at) from None
        dense[name] = replace(v, spec=spec)
    return None if dense == cfg.dense else replace(cfg, dense=dense)
